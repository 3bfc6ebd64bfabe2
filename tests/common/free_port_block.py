#!/usr/bin/env python3
"""Prints a port P for `splitserve up --port P` in a test, which also takes P+1, P+2, ... for its
children's metrics: the first port of a free, 32-aligned block of 32 ports in [20000, 30000), below
the kernel's ephemeral range, so that no other test's port-0 socket lands on a derived port (as
tests/common/http_get.h FreeLoopbackPortBlock does for the C++ tests). Exits 1 when 64 random
blocks were all partly taken."""

import random
import socket
import sys


def bindable(port):
    with socket.socket() as s:
        try:
            s.bind(('127.0.0.1', port))
            return True
        except OSError:
            return False


def main():
    for _ in range(64):
        base = 20000 + 32 * random.randrange((30000 - 20000) // 32)
        if all(bindable(p) for p in range(base, base + 32)):
            print(base)
            return
    sys.exit(1)


if __name__ == '__main__':
    main()
