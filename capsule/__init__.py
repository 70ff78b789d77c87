"""What runs inside a capsule: the frame protocol, the serve loop, plain-data conversion.

Standard library and msgpack only, so the same code runs in a CPython subprocess and in
CPython compiled to WebAssembly. The host imports ``capsule.protocol`` and nothing else.
"""
