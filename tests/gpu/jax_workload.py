"""A JAX training step for issue 42's check of libethand_cupti.so (scripts/gpu-busy-vs-nvml.sh).

Each step: a pageable (numpy) host batch put on the GPU, a jitted MLP training step in bf16
(forward, loss, gradients, SGD update), then block_until_ready. Prints `ready`, then on each
stdin line `run SECONDS` runs steps for that long and prints `steps N seconds S copy_bytes B`,
`exit` ends. Started with CUDA_INJECTION64_PATH, the driver loads the library at cuInit, and
the library finds libcupti beside the CUDA libraries JAX's wheels bring.
"""
import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--width", type=int, default=4096)
ap.add_argument("--batch", type=int, default=1024)
args = ap.parse_args()

key = jax.random.PRNGKey(0)
k1, k2 = jax.random.split(key)
scale = 1.0 / args.width**0.5
params = [
    (jax.random.normal(k1, (args.width, args.width)) * scale).astype(jnp.bfloat16),
    (jax.random.normal(k2, (args.width, args.width)) * scale).astype(jnp.bfloat16),
]
# float32 host batch in ordinary (pageable) numpy memory: 16 MiB at the defaults.
host = np.random.default_rng(0).standard_normal((args.batch, args.width), dtype=np.float32)


def loss(ps, x):
    h = jnp.tanh(x.astype(jnp.bfloat16) @ ps[0])
    return jnp.mean(jnp.square((h @ ps[1]).astype(jnp.float32)))


@jax.jit
def train(ps, x):
    value, grads = jax.value_and_grad(loss)(ps, x)
    return [p - 1e-3 * g for p, g in zip(ps, grads)], value


def step(ps):
    x = jax.device_put(host)
    ps, value = train(ps, x)
    value.block_until_ready()
    return ps


params = step(params)
print("ready", jax.devices()[0].device_kind, flush=True)
for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    if words[0] == "exit":
        break
    seconds = float(words[1])
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        params = step(params)
        n += 1
    took = time.perf_counter() - t0
    print(f"steps {n} seconds {took:.3f} copy_bytes {host.nbytes}", flush=True)
