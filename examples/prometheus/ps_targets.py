#!/usr/bin/python3
"""Prometheus file_sd targets for a ps job, before it runs or where
ps_launch does not write them (ps_launch --metrics-targets does for its
own jobs): the /metrics address of every process, with the labels
ps_launch gives (ps_job, role, ps_rank).

  ssh host file, ps_launch's port layout (ps_launch --metrics-port P:
  ps_launch P, server i P+1+i, worker j P+1+S+j; 29400 by default):
    ps_targets.py --hostfile hosts.txt [--port 29400] [--job NAME]
  Slurm, examples/slurm/multi_node.sbatch's layout (PS_METRICS_PORT=P:
  server r at P+r on the server nodes, SPN per node; the workers of a node
  at P+100+local id, WPN per node):
    ps_targets.py --slurm --port P --server-nodes "n1" --worker-nodes "n2 n3" \\
        --servers-per-node 2 --workers-per-node 4 [--job JOBID]

Writes the JSON to standard output."""

import argparse
import json
import re
import socket
import sys


def host_of(name):
    return name.split("@", 1)[1] if "@" in name else name


def group(target, job, role, rank=None):
    labels = {"ps_job": job, "role": role}
    if rank is not None:
        labels["ps_rank"] = str(rank)
    return {"targets": [target], "labels": labels}


def from_hostfile(path, port, job):
    """ps_launch --hostfile: ranks in file order (launch/hostfile.c)."""
    servers, workers = [], []
    for line in open(path):
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        host, kv = host_of(line[0]), dict(w.split("=", 1) for w in line[1:] if "=" in w)
        servers += [host] * int(kv.get("servers", 0))
        workers += [host] * int(kv.get("workers", 0))
    out = [group("%s:%d" % (socket.gethostname(), port), job, "launch")]
    out += [group("%s:%d" % (h, port + 1 + i), job, "server", i) for i, h in enumerate(servers)]
    out += [group("%s:%d" % (h, port + 1 + len(servers) + j), job, "worker", j)
            for j, h in enumerate(workers)]
    return out


def from_slurm(port, server_nodes, worker_nodes, spn, wpn, job):
    out, r = [], 0
    for n in server_nodes:
        for _ in range(spn):
            out.append(group("%s:%d" % (n, port + r), job, "server", r))
            r += 1
    w = 0
    for n in worker_nodes:
        for local in range(wpn):
            out.append(group("%s:%d" % (n, port + 100 + local), job, "worker", w))
            w += 1
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hostfile")
    p.add_argument("--slurm", action="store_true")
    p.add_argument("--port", type=int)
    p.add_argument("--server-nodes", default="")
    p.add_argument("--worker-nodes", default="")
    p.add_argument("--servers-per-node", type=int, default=1)
    p.add_argument("--workers-per-node", type=int, default=1)
    p.add_argument("--job", default="ps")
    a = p.parse_args()
    if bool(a.hostfile) == a.slurm:
        p.error("give --hostfile FILE or --slurm")
    if a.hostfile:
        out = from_hostfile(a.hostfile, a.port or 29400, a.job)
    else:
        if not a.port:
            p.error("--slurm needs --port (the sbatch script's PS_METRICS_PORT)")
        out = from_slurm(a.port, re.split(r"[\s,]+", a.server_nodes.strip()),
                         re.split(r"[\s,]+", a.worker_nodes.strip()), a.servers_per_node,
                         a.workers_per_node, a.job)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
