from dataclasses import dataclass


def make():
    """Returns an instance of a class defined inside the function: it has no name."""

    @dataclass
    class Local:
        x: int

    return Local(1)
