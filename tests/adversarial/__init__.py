"""The standing adversarial suite, grouped by the sections of the security catalogue
(``test_d_*``: policy, ``test_e_*``: approvals and grants, ``test_h_*``: the audit, and
``test_caches``): each attack asserts on canaries and state, never only on an exception."""
