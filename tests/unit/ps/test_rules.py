"""Every server-side update rule against PyTorch's optimizer (the reference users compare with) and against the
rule's own formula in plain numpy; sparse updates touch only the pushed rows and their slots."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hora.errors import ConfigError
from hora.ps.rules import SGD, Adam, Momentum, UpdateRule, apply_dense, apply_rows, new_slots, parse_rule

STEPS = 5


def _torch_reference(rule: dict, p0: np.ndarray, grads: list[np.ndarray]) -> np.ndarray:
    p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    name = rule["rule"]
    if name == "sgd":
        opt = torch.optim.SGD([p], lr=rule["lr"])
    elif name == "momentum":
        opt = torch.optim.SGD([p], lr=rule["lr"], momentum=rule["momentum"], nesterov=rule["nesterov"])
    elif name == "adagrad":
        opt = torch.optim.Adagrad([p], lr=rule["lr"], eps=rule["epsilon"], initial_accumulator_value=rule["initial_accumulator"])
    else:
        opt = torch.optim.Adam([p], lr=rule["lr"], betas=(rule["beta1"], rule["beta2"]), eps=rule["epsilon"])
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    return p.detach().numpy()


def _numpy_reference(rule: dict, p0: np.ndarray, grads: list[np.ndarray]) -> np.ndarray:
    p = p0.astype(np.float64)
    buf = np.zeros_like(p)
    acc = np.full_like(p, rule.get("initial_accumulator", 0.0))
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        if rule["rule"] == "sum":
            p = p + g
        elif rule["rule"] == "sgd":
            p = p - rule["lr"] * g
        elif rule["rule"] == "momentum":
            buf = rule["momentum"] * buf + g
            p = p - rule["lr"] * ((g + rule["momentum"] * buf) if rule["nesterov"] else buf)
        elif rule["rule"] == "adagrad":
            acc = acc + g * g
            p = p - rule["lr"] * g / (np.sqrt(acc) + rule["epsilon"])
        else:
            m = rule["beta1"] * m + (1 - rule["beta1"]) * g
            v = rule["beta2"] * v + (1 - rule["beta2"]) * g * g
            mhat, vhat = m / (1 - rule["beta1"] ** t), v / (1 - rule["beta2"] ** t)
            p = p - rule["lr"] * mhat / (np.sqrt(vhat) + rule["epsilon"])
    return p


RULES = [
    {"rule": "sum"},
    {"rule": "sgd", "lr": 0.1},
    {"rule": "momentum", "lr": 0.05, "momentum": 0.9},
    {"rule": "momentum", "lr": 0.05, "momentum": 0.8, "nesterov": True},
    {"rule": "adagrad", "lr": 0.1, "initial_accumulator": 0.1, "epsilon": 1e-7},
    {"rule": "adam", "lr": 0.01},
]


@pytest.mark.parametrize("spec", RULES, ids=lambda r: f"{r['rule']}{'-nesterov' if r.get('nesterov') else ''}")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_rule_matches_references(spec, dtype):
    rule = parse_rule(spec)
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal((6, 4)).astype(dtype)
    grads = [rng.standard_normal((6, 4)).astype(dtype) for _ in range(STEPS)]
    p = p0.copy()
    slots = new_slots(rule, p.shape, p.dtype)
    for t, g in enumerate(grads, 1):
        apply_dense(rule, p, g, slots, t)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    wire = rule.to_json()  # every hyperparameter, defaults filled in
    np.testing.assert_allclose(p, _numpy_reference(wire, p0, grads), rtol=tol, atol=tol)
    if rule.name != "sum":
        np.testing.assert_allclose(p, _torch_reference(wire, p0, grads), rtol=tol, atol=tol)


@pytest.mark.parametrize("spec", RULES, ids=lambda r: r["rule"])
def test_sparse_rule_touches_only_the_rows_and_their_slots(spec):
    rule = parse_rule(spec)
    rng = np.random.default_rng(1)
    p = rng.standard_normal((10, 3)).astype(np.float32)
    slots = new_slots(rule, p.shape, p.dtype)
    before_p = p.copy()
    before_slots = {k: v.copy() for k, v in slots.items()}
    rows = np.array([1, 4, 7])
    grads = [rng.standard_normal((3, 3)).astype(np.float32) for _ in range(STEPS)]
    for t, g in enumerate(grads, 1):
        apply_rows(rule, p, rows, g, slots, t)
    untouched = np.setdiff1d(np.arange(10), rows)
    np.testing.assert_array_equal(p[untouched], before_p[untouched])
    for k in slots:
        np.testing.assert_array_equal(slots[k][untouched], before_slots[k][untouched])
    # the touched rows follow the dense rule applied to those rows alone
    dense = before_p[rows].copy()
    dense_slots = new_slots(rule, dense.shape, dense.dtype)
    for t, g in enumerate(grads, 1):
        apply_dense(rule, dense, g, dense_slots, t)
    np.testing.assert_array_equal(p[rows], dense)


def test_rules_are_checked_data_with_one_wire_form():
    assert parse_rule("sgd") == SGD(lr=0.01)
    assert parse_rule("sgd").to_json() == {"rule": "sgd", "lr": 0.01}
    adam = parse_rule({"rule": "ADAM", "lr": 1})
    assert adam == Adam(lr=1.0) and isinstance(adam.lr, float)
    for rule in (adam, Momentum(lr=0.1, nesterov=True), parse_rule("sum"), parse_rule("adagrad")):
        assert parse_rule(rule.to_json()) == rule  # the wire form round-trips
        assert parse_rule(rule) is rule
    assert isinstance(parse_rule("momentum"), UpdateRule)
    with pytest.raises(ConfigError, match=r"sgd.lr must be a finite number, got inf"):
        SGD(lr=float("inf"))  # a rule built in code is checked as one from the wire
    with pytest.raises(ConfigError, match=r"register: momentum.nesterov must be true or false, got 'yes'"):
        parse_rule({"rule": "momentum", "nesterov": "yes"}, "register")
    for bad, words in [
        ("rmsprop", "unknown rule 'rmsprop'"),
        ({"rule": "sgd", "momentum": 0.9}, "no parameter momentum"),
        ({"rule": "sgd", "lr": float("nan")}, "finite number"),
        ({"rule": "sgd", "lr": "0.1"}, "finite number"),
        ({"rule": "momentum", "nesterov": 1}, "true or false"),
        ({"lr": 0.1}, "'rule' key"),
        ({"rule": "adam", "lr": -1.0}, ">= 0"),
        # issue 27, item 9: ranges, and a number too big for a float, named with the rule
        ({"rule": "adam", "beta1": 5.0}, r"adam.beta1 must be in \[0, 1\), got 5.0"),
        ({"rule": "adam", "beta2": 1}, r"adam.beta2 must be in \[0, 1\)"),
        ({"rule": "momentum", "momentum": 1.5}, r"momentum.momentum must be in \[0, 1\)"),
        ({"rule": "sgd", "lr": 10**400}, "sgd.lr must be a finite number, got an integer of 401 digits"),
    ]:
        with pytest.raises(ConfigError, match=words):
            parse_rule(bad)
