"""What a burn runs: the load tests a worker drives on its GPU (matmul, memory, p2p, all-reduce),
the ``sw`` checks that need no load, and the fault injection tests use to break them on purpose.

Each load returns JSON-ready figures and judges nothing; torch comes in through ``Context``.
"""
