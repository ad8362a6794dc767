#!/usr/bin/python3
"""The bare Python client: fit one tensor to 1 (the gradient of |w - 1|^2/2
is w - 1), pushing gradients and pulling weights in place.

Servers, rank and worker count come from the environment when not given
(PS_SERVERS, PS_RANK, PS_NUM_WORKERS, PS_MODE; ps_launch --exec sets them).
The servers apply SGD with rate 0.5, so w reaches 1 - 2^-10 in 10 steps;
the client expects that rate, so servers started with another one are
refused at start naming both values instead of fitting to something else:

  bin/ps_server --bind tcp://127.0.0.1:5555 --num-workers 1 --lr 0.5 &
  PS_SERVERS=tcp://127.0.0.1:5555 /usr/bin/python3 examples/python_push_pull.py
  bin/ps_launch --servers 2 --workers 2 --lr 0.5 --exec /usr/bin/python3 examples/python_push_pull.py
"""
import os
import sys

import numpy as np

try:
    import ps
except ImportError:  # run from the source tree, not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import ps

w = np.zeros(1000, np.float32)         # the weights: pulls write into w in place
grad = np.empty_like(w)
# or ps.Client(servers="tcp://H:P,...", rank=0, num_workers=1, ...)
with ps.Client(expect={"optimizer": "sgd", "lr": 0.5}) as c:
    c.register(0, w.size)              # every tensor, in the same order on every worker
    c.start()                          # hello: a server that disagrees is refused here
    c.init(0, w).wait()                # the first init of a tensor wins
    for step in range(10):
        grad[:] = w - 1.0              # your backward pass
        c.push(0, grad, step).wait()   # sent from grad in place
        c.pull(0, w, step + 1).wait()  # the servers' weights, version >= step + 1
    c.barrier(1)                       # every worker has pushed its 10 steps
    c.pull(0, w, 0).wait()
    print("worker %d of %d: w[0] = %.10g after 10 steps" % (c.rank, c.num_workers, w[0]))
