#!/usr/bin/env python3
"""Writes the seed inputs of the structure-aware targets `data_plane`, `engine_model` and
`peer_handler` into seeds/<target>/.

The three targets read their input through `arbitrary` (fuzz_targets/data_plane.rs: a sequence of typed
requests; fuzz_targets/engine_model.rs: a selector byte, then one model operation per chunk;
fuzz_targets/peer_handler.rs: a pin limit, then peer requests and time steps), so every
byte string is a valid input and random bytes already make long sessions: many requests of every kind,
pools created early and then used. Hand-encoding `arbitrary`'s layout would tie the seeds to its
version; seeded random bytes do not and stay deterministic. engine_model's first byte picks the engine
(byte % 4: plain, de-duplication and compression, compression, failing disk), so the seeds cover each.
"""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = 8
LENGTH = 512

for target in ("data_plane", "engine_model", "peer_handler"):
    out = os.path.join(HERE, target)
    os.makedirs(out, exist_ok=True)
    rng = random.Random(f"dd-fuzz-{target}")
    for i in range(SEEDS):
        data = bytearray(rng.getrandbits(8) for _ in range(LENGTH))
        if target == "engine_model":
            data[0] = (data[0] & ~3) | (i % 4)
        with open(os.path.join(out, f"random_{i}"), "wb") as f:
            f.write(bytes(data))
