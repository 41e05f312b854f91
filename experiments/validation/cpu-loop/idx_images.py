"""The image set the cpu loop (run.py) and the planner's closed loop
(experiments/planner/closed_loop.py) train their vision model on."""
import os


def write_images(path):
    """A synthetic 28×28 IDX set (MNIST layout): timing does not depend on the pixels."""
    os.makedirs(path, exist_ok=True)
    for prefix, n in (("train", 2048), ("t10k", 256)):
        head = lambda magic, dims: b"".join(v.to_bytes(4, "big") for v in [magic] + dims)
        with open(os.path.join(path, prefix + "-images-idx3-ubyte"), "wb") as f:
            f.write(head(0x803, [n, 28, 28]) + bytes((i * 2654435761 >> 13) & 255 for i in range(n * 784)))
        with open(os.path.join(path, prefix + "-labels-idx1-ubyte"), "wb") as f:
            f.write(head(0x801, [n]) + bytes(i % 10 for i in range(n)))
