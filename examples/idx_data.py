"""MNIST-style IDX files as a torch Dataset, for the examples that stand in
for scripts written against torchvision's datasets.MNIST (no network, no
torchvision needed): Fashion-MNIST from /usr/share/datasets/fashion-mnist
(make deps installs it), the same 28x28 images and 10 classes.

    from idx_data import MNIST
    train = MNIST("/usr/share/datasets/fashion-mnist", train=True)
    image, label = train[0]        # a 1x28x28 float tensor, normalised; an int

Images are scaled to [0, 1] and normalised with mean 0.1307 and deviation
0.3081, as transforms.Normalize((0.1307,), (0.3081,)) does in those
scripts.
"""

import gzip
import os
import struct

import torch

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (optionally .gz) as a uint8 tensor."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError("%s: not an IDX file of unsigned bytes" % path)
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).view(*dims)


class MNIST(torch.utils.data.Dataset):
    """The train (60000) or test (10000) split of the IDX files in root."""

    def __init__(self, root=DATA, train=True, mean=0.1307, std=0.3081):
        prefix = "train" if train else "t10k"
        x = read_idx(os.path.join(root, prefix + "-images-idx3-ubyte"))
        self.data = (x.float().div_(255.0).sub_(mean).div_(std)).unsqueeze(1)
        self.targets = read_idx(os.path.join(root, prefix + "-labels-idx1-ubyte")).long()

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.data[i], int(self.targets[i])
