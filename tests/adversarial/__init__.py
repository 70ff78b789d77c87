"""The standing adversarial suite, one file per section of the attack catalogue
(``test_a_*``: agent code, ``test_b_*``: Wasm paths, ``test_c_*``: subprocess capsules,
``test_d_*``: policy and callers, ``test_e_*``: approvals, grants and secrets,
``test_g_*``: frames, ``test_h_*``: the audit, and ``test_caches``): each attack asserts
on canaries and state (files, processes, the next call or run), never only on an
exception."""
