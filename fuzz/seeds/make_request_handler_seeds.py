#!/usr/bin/env python3
"""Writes the seed inputs of the `request_handler` fuzz target into seeds/request_handler/.

An input is one selector byte (byte % 3 = 0: no HELLO, 1: a valid HELLO of VM 1, 2: a HELLO with a wrong
token; with 0x80 set the HELLO offers version 2, else version 1 only;
see fuzz_targets/request_handler.rs) followed by the connection's bytes. Without seeds libFuzzer spends
its run finding the frame magic; with them it starts from well-formed sessions (every op, VM_STATS of
many pools, oversized and early frames before HELLO) and mutates those. Frames follow docs/protocol.md
(20-byte header: magic "DD", version, op, flags, status, request id, payload length).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "request_handler")
PAGE = 4096
rid = 0


def frame(op, payload=b"", length=None):
    global rid
    rid += 1
    n = len(payload) if length is None else length
    return b"DD" + struct.pack("<BBHHQI", 1, op, 0, 0, rid, n) + payload


def spec_mem(w=100):
    return struct.pack("<BII", 1, w, 0)


def key(obj, idx):
    return struct.pack("<QQ", obj, idx)


def create_pool(persistent=0):
    return frame(3, bytes([persistent, 0, 1]) + spec_mem())


def pool(p):
    return struct.pack("<I", p)


seeds = {
    "stats_of_many_pools": bytes([1]) + b"".join(create_pool() for _ in range(48)) + frame(14) + frame(15),
    "every_op": bytes([1])
    + create_pool()
    + create_pool(1)
    + frame(2)
    + frame(6, pool(1) + key(7, 1) + bytes([0xA5]) * PAGE)
    + frame(7, pool(1) + key(7, 1))
    + frame(11, pool(1) + struct.pack("<I", 2) + key(7, 2) + key(7, 3) + bytes([0x5A]) * (2 * PAGE))
    + frame(12, pool(1) + struct.pack("<I", 2) + key(7, 2) + key(7, 3))
    + frame(13, pool(1))
    + frame(8, pool(1) + key(7, 2))
    + frame(10, pool(1) + pool(2) + struct.pack("<Q", 7))
    + frame(9, pool(2) + struct.pack("<Q", 7))
    + frame(5, pool(1) + struct.pack("<BII", 3, 10, 20))
    + frame(4, pool(2))
    + frame(14),
    "preauth_oversized_hello": bytes([0]) + frame(1, length=2 << 20) + bytes(64),
    "preauth_request_before_hello": bytes([0]) + frame(14) + frame(2),
    "preauth_bad_magic": bytes([0]) + b"XX" + bytes(18),
    "wrong_token_then_requests": bytes([2]) + frame(15) + frame(14),
}

os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
