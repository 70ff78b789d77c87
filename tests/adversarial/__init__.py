"""The standing adversarial suite (issue 12): one file per section of the security
catalogue, each case asserting on state (canaries, processes, the next call or run),
never only on an exception."""
