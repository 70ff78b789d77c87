def fine() -> int:
    return 1


return 5  # noqa: F706 - valid to ast, not to Python: pyright reports it without a rule
