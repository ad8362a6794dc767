#!/usr/bin/python3
# examples/torch_word_lm.py through the parameter servers with ps.torch, AdamW
# on the servers (--optimizer adamw: ps.torch.server_flags says the flags),
# each worker on its own contiguous share of the training words (shares of
# unequal length: the worker whose share ends first waits in pull_final for
# the others, whose steps go on without it).  The lines marked "ps.torch"
# are all that changed (docs/TORCH.md "A language model with AdamW").
#   bin/ps_launch --servers 1 --workers 2 --mode sync --optimizer adamw \
#       --lr 0.003 --weight-decay 0.01 --exec /usr/bin/python3 examples/torch_word_lm_ps.py
import argparse
import math
import os
import time

import ps.torch  # ps.torch
import torch
import torch.nn as nn


class Corpus:
    """Word ids of the train, valid and test lines (<eos> ends each line)."""

    def __init__(self, path):
        names = sorted(n for n in os.listdir(path) if os.path.isfile(os.path.join(path, n)))
        lines = []
        for n in names:
            with open(os.path.join(path, n), encoding="utf-8", errors="replace") as f:
                lines += [line.split() + ["<eos>"] for line in f if line.strip()]
        self.words = {}
        for line in lines:
            for w in line:
                self.words.setdefault(w, len(self.words))
        parts = {"train": [], "valid": [], "test": []}
        for i, line in enumerate(lines):
            parts["valid" if i % 10 == 8 else "test" if i % 10 == 9 else "train"] += line
        for k, words in parts.items():
            setattr(self, k, torch.tensor([self.words[w] for w in words], dtype=torch.long))


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout if nlayers > 1 else 0.0)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out)), hidden

    def init_hidden(self, bsz):
        w = next(self.parameters())
        return (w.new_zeros(self.nlayers, bsz, self.nhid), w.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz):
    """data as bsz columns (the rest that does not fill a row dropped)."""
    n = data.size(0) // bsz
    return data[:n * bsz].view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    n = min(bptt, len(source) - 1 - i)
    return source[i:i + n], source[i + 1:i + 1 + n].reshape(-1)


def repackage(hidden):
    """The hidden state without its history (backpropagation stops here)."""
    return tuple(h.detach() for h in hidden)


def evaluate(model, source, args, ntokens):
    model.eval()
    total, hidden = 0.0, model.init_hidden(source.size(1))
    criterion = nn.CrossEntropyLoss()
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, args.bptt):
            data, targets = get_batch(source, i, args.bptt)
            output, hidden = model(data, hidden)
            total += len(data) * criterion(output.view(-1, ntokens), targets).item()
    return total / (len(source) - 1)


def train_epoch(model, optimizer, train_data, args, ntokens, epoch):
    model.train()
    criterion = nn.CrossEntropyLoss()
    total, start = 0.0, time.time()
    hidden = model.init_hidden(args.batch_size)
    nbatches = (train_data.size(0) - 1 + args.bptt - 1) // args.bptt
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        if args.steps and batch == args.steps:
            break
        data, targets = get_batch(train_data, i, args.bptt)
        hidden = repackage(hidden)
        optimizer.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, ntokens), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        total += loss.item()
        if batch % args.log_interval == 0 and batch > 0:
            cur = total / args.log_interval
            print("| epoch {:3d} | {:5d}/{:5d} batches | ms/batch {:6.1f} | loss {:5.2f} | "
                  "ppl {:8.2f}".format(epoch, batch, nbatches,
                                       (time.time() - start) * 1000 / args.log_interval, cur,
                                       math.exp(cur)), flush=True)
            total, start = 0.0, time.time()


def main():
    parser = argparse.ArgumentParser(description="word-level LSTM language model, AdamW")
    parser.add_argument("--data", default="/usr/share/common-licenses")
    parser.add_argument("--emsize", type=int, default=64)
    parser.add_argument("--nhid", type=int, default=128)
    parser.add_argument("--nlayers", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bptt", type=int, default=20)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1111)
    parser.add_argument("--log-interval", type=int, default=50)
    parser.add_argument("--steps", type=int, default=0, help="stop each epoch after N batches")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save", default="", help="the model's state_dict here at the end")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    corpus = Corpus(args.data)
    ntokens = len(corpus.words)
    corpus.train = corpus.train.chunk(ps.torch.size())[ps.torch.rank()]  # ps.torch: its share
    train_data = batchify(corpus.train, args.batch_size)
    val_data, test_data = batchify(corpus.valid, 10), batchify(corpus.test, 10)
    print("vocabulary {} words; train {}, valid {}, test {} words".format(
        ntokens, len(corpus.train), len(corpus.valid), len(corpus.test)), flush=True)
    model = RNNModel(ntokens, args.emsize, args.nhid, args.nlayers, args.dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    optimizer = ps.torch.DistributedOptimizer(optimizer, model=model)  # ps.torch
    for epoch in range(1, args.epochs + 1):
        start = time.time()
        train_epoch(model, optimizer, train_data, args, ntokens, epoch)
        val = evaluate(model, val_data, args, ntokens)
        print("| end of epoch {:3d} | time: {:5.1f}s | valid loss {:5.2f} | valid ppl {:8.2f}"
              .format(epoch, time.time() - start, val, math.exp(val)), flush=True)
    optimizer.pull_final()  # ps.torch: the servers' weights, once every worker is done
    test = evaluate(model, test_data, args, ntokens)
    print("| End of training | test loss {:5.2f} | test ppl {:8.2f}".format(test, math.exp(test)),
          flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
