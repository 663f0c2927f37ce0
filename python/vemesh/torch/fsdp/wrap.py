"""Auto-wrap policies: which submodules become FSDP units of their own.

PyTorch's ``torch.distributed.fsdp.wrap`` names and calling convention. A
policy is called as ``policy(module=m, recurse=True, nonwrapped_numel=n)``
("look inside m?", n = parameters of m not yet in a unit) and then
``policy(module=m, recurse=False, nonwrapped_numel=rest)`` ("make m a unit
for what its children left?"). Policies written for torch 1.13, whose third
argument is ``unwrapped_params``, work too, and so does a set of module
classes (torch >= 2.1)::

    FSDP(model, device_mesh=mesh, auto_wrap_policy=ModuleWrapPolicy({Block}))
    FSDP(model, device_mesh=mesh, auto_wrap_policy=functools.partial(
        size_based_auto_wrap_policy, min_num_params=10_000))

The outermost module is always a unit (it takes whatever no other unit
took), as with PyTorch. Units are ordered children first, the root last.
"""

import inspect

import torch.nn as nn


def always_wrap_policy(*args, **kwargs):
    """Every submodule with parameters is a unit."""
    return True


def lambda_auto_wrap_policy(module, recurse, nonwrapped_numel=0, lambda_fn=None,
                            **kwargs):
    """A unit where ``lambda_fn(module)`` is true."""
    return True if recurse else bool(lambda_fn(module))


def transformer_auto_wrap_policy(module, recurse, nonwrapped_numel=0,
                                 transformer_layer_cls=(), **kwargs):
    """A unit per instance of one of ``transformer_layer_cls``."""
    return True if recurse else isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(module, recurse, nonwrapped_numel=None,
                                min_num_params=int(1e8),
                                force_leaf_modules=None,
                                exclude_wrap_modules=None, **kwargs):
    """A unit for any subtree with at least ``min_num_params`` parameters not
    in a unit yet (not inside ``force_leaf_modules``, never an
    ``exclude_wrap_modules``; PyTorch's defaults)."""
    if nonwrapped_numel is None:
        nonwrapped_numel = kwargs.get("unwrapped_params", 0)
    leaves = (size_based_auto_wrap_policy.FORCE_LEAF_MODULES
              if force_leaf_modules is None else force_leaf_modules)
    excluded = (size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES
                if exclude_wrap_modules is None else exclude_wrap_modules)
    large = nonwrapped_numel >= min_num_params
    if recurse:
        return large and not isinstance(module, tuple(leaves))
    return large and not isinstance(module, tuple(excluded))


size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList,
                                                    nn.ModuleDict}
size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}


class ModuleWrapPolicy:
    """A unit per instance of one of ``module_classes`` (torch >= 2.0)."""

    def __init__(self, module_classes):
        self._classes = tuple(module_classes)

    def __call__(self, module, recurse, *args, **kwargs):
        return True if recurse else isinstance(module, self._classes)

    def __repr__(self):
        return f"ModuleWrapPolicy({[c.__name__ for c in self._classes]})"


def _as_callable(policy):
    """`policy` called as policy(module, recurse, numel)."""
    if isinstance(policy, (set, frozenset, list, tuple)):
        if not all(isinstance(c, type) and issubclass(c, nn.Module)
                   for c in policy):
            raise TypeError(
                "auto_wrap_policy: a set must hold nn.Module classes; got "
                f"{sorted(type(c).__name__ for c in policy)}")
        policy = ModuleWrapPolicy(policy)
    if not callable(policy):
        raise TypeError(
            f"auto_wrap_policy is a {type(policy).__name__}; expected a "
            "callable policy(module, recurse, nonwrapped_numel), a "
            "ModuleWrapPolicy or a set of nn.Module classes")
    try:
        params = inspect.signature(policy).parameters
    except (TypeError, ValueError):
        params = {}
    if "nonwrapped_numel" in params:
        return lambda m, r, n: policy(module=m, recurse=r, nonwrapped_numel=n)
    if "unwrapped_params" in params:  # torch 1.13's spelling
        return lambda m, r, n: policy(module=m, recurse=r, unwrapped_params=n)
    return lambda m, r, n: policy(m, r, n)


def plan_units(root, policy, ignored_modules, ignored_params):
    """The modules that become units, children first, `root` last.

    Follows PyTorch's recursion: a module the policy recurses into
    offers its children first; then the policy decides on the remainder.
    """
    units = []
    if policy is not None:
        decide = _as_callable(policy)

        def numel(module):
            seen, n = set(), 0
            for p in module.parameters():
                if id(p) not in seen and id(p) not in ignored_params:
                    seen.add(id(p))
                    n += p.numel()
            return n

        def visit(module, is_root):
            total = numel(module)
            if not decide(module, True, total):
                return 0
            wrapped = 0
            for child in module.children():
                if id(child) in ignored_modules:
                    continue
                wrapped += visit(child, False)
            if not is_root and decide(module, False, total - wrapped):
                units.append(module)
                return total
            return wrapped

        visit(root, True)
    units.append(root)
    return units
