#!/usr/bin/python3
# examples/torch_hogwild.py through the parameter servers with ps.torch: the
# processes that shared one model are ps_launch workers (or torchrun's, or
# hosts of their own), each stepping its own SGD; the servers, started with
# --optimizer add, add what each step changed in the weights (async: as the
# steps come, as Hogwild's unlocked writes do).  The lines marked "ps.torch"
# are what changed; the multiprocessing lines went (docs/TORCH.md "Hogwild").
#   bin/ps_launch --servers 1 --workers 2 --mode async --optimizer add --exec \
#       /usr/bin/python3 examples/torch_hogwild_ps.py --epochs 1
import argparse
import os
import sys

import ps.torch  # ps.torch
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from idx_data import MNIST  # noqa: E402 (torchvision's datasets.MNIST, here)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.dropout(F.relu(self.fc1(x.flatten(1))), training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def train(rank, args, model, dataset):
    torch.manual_seed(args.seed + rank)
    torch.set_num_threads(args.threads)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    optimizer = ps.torch.DistributedOptimizer(optimizer, model=model)  # ps.torch
    model.train()
    for epoch in range(1, args.epochs + 1):
        for batch_idx, (data, target) in enumerate(loader):
            if args.steps and batch_idx == args.steps:
                break
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0:
                print("{}\tTrain Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                    os.getpid(), epoch, batch_idx * len(data), len(loader.dataset),
                    100.0 * batch_idx / len(loader), loss.item()), flush=True)
    optimizer.pull_final()  # ps.torch: the servers' weights, once every worker is done


def test(model, dataset):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in torch.utils.data.DataLoader(dataset, batch_size=1000):
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            correct += (output.argmax(1) == target).sum().item()
    n = len(dataset)
    print("\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.2f}%)\n".format(
        loss / n, correct, n, 100.0 * correct / n), flush=True)


def main():
    parser = argparse.ArgumentParser(description="Hogwild! on Fashion-MNIST")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=100)
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0, help="stop each epoch after N batches")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--data", default=os.environ.get("PS_TORCH_DATA",
                                                         "/usr/share/datasets/fashion-mnist"))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    dataset1, dataset2 = MNIST(args.data, train=True), MNIST(args.data, train=False)
    model = Net()
    train(ps.torch.rank(), args, model, dataset1)  # ps.torch: this process is one of them
    if ps.torch.rank() == 0:  # ps.torch
        test(model, dataset2)  # ps.torch: rank 0 tests


if __name__ == "__main__":
    main()
