"""The demo's training action: logistic regression by mini-batch SGD (NumPy) on one shard.

Deployed as source to the embedded platform by ``faasdl demo``. The shard is generated from
(seed, shard, shards) so that no data travels in the payload; the global weights do.
"""

import time
from typing import Any

import numpy as np

FEATURES = 32


def make_data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    truth = np.random.default_rng(0).normal(size=FEATURES)
    x = rng.normal(size=(n, FEATURES))
    y = (x @ truth + rng.normal(scale=0.5, size=n) > 0).astype(np.float64)
    return x, y


def main(args: dict[str, Any]) -> dict[str, Any]:
    x, y = make_data(1000 + int(args["shard"]), int(args["examples"]))
    w = np.asarray(args.get("weights") or np.zeros(FEATURES), dtype=np.float64)
    rng = np.random.default_rng(int(args["round"]) * 100 + int(args["shard"]))
    started = time.time()
    for _ in range(int(args["epochs"])):
        order = rng.permutation(len(y))
        for start in range(0, len(y), 8):
            batch = order[start : start + 8]
            p = 1 / (1 + np.exp(-(x[batch] @ w)))
            w -= 0.05 * x[batch].T @ (p - y[batch]) / len(batch)
    p = np.clip(1 / (1 + np.exp(-(x @ w))), 1e-9, 1 - 1e-9)
    loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    print(
        f"shard {args['shard']} round {args['round']}: "
        f"loss {loss:.4f} in {time.time() - started:.2f} s"
    )
    return {"weights": w.tolist(), "examples": len(y), "loss": loss}
