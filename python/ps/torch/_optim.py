"""How a torch optimizer's settings map to the servers' optimizer.

The servers apply the update (server/optimizer.c), so a torch optimizer
given to the wrapper is never stepped: its settings become the expectation
the client checks at hello (a server running anything else is refused, with
both values named) and the flags to start the servers with.

  torch                                         servers
  SGD(lr, momentum=0, weight_decay)             --optimizer sgd --lr --weight-decay
  SGD(lr, momentum>0, weight_decay)             --optimizer momentum --momentum
  SGD(lr, momentum>0, nesterov=True)            --optimizer nesterov --momentum
  Adam(lr, betas=(b1, b2), eps, weight_decay)   --optimizer adam --beta1 --beta2 --eps
  AdamW(lr, betas, eps, weight_decay)           --optimizer adamw (decoupled decay:
                                                w *= 1 - lr*wd, then adam)
  Adagrad(lr, eps, weight_decay)                --optimizer adagrad --eps

The formulas are torch's single-tensor steps (foreach=False, torch 1.13's
default on the CPU) operation for operation (server/optimizer.h): one worker
through the servers repeats plain torch bit for bit (adam and adamw: when lr,
the betas and adamw's weight_decay have at most 7 significant digits, as
1e-3, 0.9, 0.999, 0.01: the servers hold float32 values and derive 1 - beta1,
lr / (1 - beta1^t) and 1 - lr*wd from the shortest decimal of each).
Refused, because the servers do something else: SGD dampening != 0, Adam
amsgrad, maximize, Adagrad lr_decay != 0 or initial_accumulator_value != 0,
several parameter groups with different settings,
any other optimizer: those run with update="worker" (ps.torch
DistributedOptimizer: the servers average, each worker steps its own torch
optimizer).  A learning-rate scheduler, or any change of a group's
hyper-parameters, is sent to the servers by DistributedOptimizer before the
next step's pushes (ps.Client.hyper).

The servers' optimizer state in torch's form (state_dict): momentum and
nesterov keep one array, momentum_buffer; adagrad one, sum (and step); adam
two, exp_avg and exp_avg_sq (and step, the servers' step count).
"""

import torch

# the servers' kind -> the names of its state arrays in torch's state
STATE_NAMES = {"sgd": (), "momentum": ("momentum_buffer",), "nesterov": ("momentum_buffer",),
               "adagrad": ("sum",), "adam": ("exp_avg", "exp_avg_sq"),
               "adamw": ("exp_avg", "exp_avg_sq")}
# kinds whose torch state has a step count
STEP_KINDS = ("adagrad", "adam", "adamw")


def _group_settings(opt, groups=None):
    """The one set of hyper-parameters of all of opt's parameter groups (or
    of those of `groups`: the groups whose tensors the servers hold), but the
    server tables' own (ps.torch._tables)."""
    groups = opt.param_groups if groups is None else groups
    keys = [k for k in opt.defaults if k != "params"]
    groups = [g for g in groups if "ps_table" not in g] or [opt.defaults]
    first = {k: groups[0].get(k) for k in keys}
    for g in groups[1:]:
        for k in keys:
            if g.get(k) != first[k]:
                raise ValueError("%s: parameter groups differ in %s (%r and %r); the servers run "
                                 "one optimizer for every tensor"
                                 % (type(opt).__name__, k, first[k], g.get(k)))
    return first


def _refuse(opt, what):
    raise ValueError("%s with %s has no equivalent on the servers (see ps.torch: what maps to "
                     "what)" % (type(opt).__name__, what))


def server_settings(opt, groups=None):
    """{'optimizer': 'momentum', 'lr': 0.05, 'momentum': 0.9, 'weight_decay': 0.0}
    for a torch optimizer (its groups, or `groups`); ValueError when the
    servers cannot run it."""
    name = type(opt).__name__
    s = _group_settings(opt, groups)
    if s.get("maximize"):
        _refuse(opt, "maximize=True")
    out = {"lr": float(s["lr"]), "weight_decay": float(s.get("weight_decay") or 0.0)}
    if name == "SGD":
        if s.get("dampening"):
            _refuse(opt, "dampening=%r" % s["dampening"])
        mom = float(s.get("momentum") or 0.0)
        if mom == 0.0:
            if s.get("nesterov"):
                _refuse(opt, "nesterov=True and momentum 0")
            out["optimizer"] = "sgd"
        else:
            out["optimizer"] = "nesterov" if s.get("nesterov") else "momentum"
            out["momentum"] = mom
    elif name in ("Adam", "AdamW"):
        if s.get("amsgrad"):
            _refuse(opt, "amsgrad=True")
        b1, b2 = s["betas"]
        out.update(optimizer="adamw" if name == "AdamW" else "adam", beta1=float(b1),
                   beta2=float(b2), eps=float(s["eps"]))
    elif name in ("Adagrad", "RowWiseAdagrad", "RWSAdagrad", "RowWiseSparseAdagrad"):
        # the row-wise ones: Adagrad on dense gradients (their rows: the tables')
        if s.get("lr_decay"):
            _refuse(opt, "lr_decay=%r" % s["lr_decay"])
        if s.get("initial_accumulator_value"):
            _refuse(opt, "initial_accumulator_value=%r" % s["initial_accumulator_value"])
        out.update(optimizer="adagrad", eps=float(s["eps"]))
    else:
        raise ValueError("%s has no equivalent on the servers; they run sgd, momentum, nesterov, "
                         "adam, adamw or adagrad (torch SGD, Adam, AdamW, Adagrad)" % name)
    return out


def server_flags(opt):
    """The ps_server (and ps_launch) flags that run what opt would:
    "--optimizer momentum --lr 0.05 --momentum 0.9 --weight-decay 0"."""
    s = server_settings(opt)
    words = ["--optimizer", s.pop("optimizer")]
    for k, v in s.items():
        words += ["--" + k.replace("_", "-"), "%.9g" % v]
    return " ".join(words)


def hyper_of(opt, groups=None):
    """The hyper-parameters opt runs with as the servers name them
    (server_settings without the kind), float32 as the servers keep them."""
    out = {}
    for k, v in server_settings(opt, groups).items():
        if k != "optimizer":
            out[k] = float(torch.tensor(v, dtype=torch.float32))
    return out


def planes_to_state(kind, planes, step, pushed):
    """One parameter's torch optimizer state from the servers' arrays
    (tensors shaped as the parameter) and step count; None when it has none
    yet (torch has none before the first step; pushed: steps this worker
    pushed, for kinds whose state has no count)."""
    if (step if kind in STEP_KINDS else pushed) <= 0:
        return None
    if kind == "sgd":
        return {"momentum_buffer": None}
    st = dict(zip(STATE_NAMES[kind], planes))
    if kind in STEP_KINDS:
        st["step"] = torch.tensor(float(step))
    return st


def state_to_planes(kind, state):
    """(arrays, step) the servers take from one parameter's torch state, or
    None when the kind keeps none or the state is empty."""
    names = STATE_NAMES[kind]
    if not names or not state or any(state.get(n) is None for n in names):
        return None
    step = state.get("step", -1)  # -1: the servers keep their count (momentum has none)
    step = int(step.item() if torch.is_tensor(step) else step)
    return [state[n] for n in names], step
