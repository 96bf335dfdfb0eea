"""advisor.profile.tensors.leaves: torch's tree_flatten leaves, walked without a TreeSpec."""

from collections import OrderedDict, namedtuple

import torch
from torch.utils._pytree import tree_flatten

from advisor.profile.tensors import leaves

Pair = namedtuple("Pair", "first second")


def test_leaves_are_tree_flattens_on_what_ops_take_and_give():
    x, y = torch.ones(2), torch.zeros(3)
    values, indices = torch.max(torch.ones(2, 2), dim=0)  # a structseq (torch.return_types.max)
    trees = [
        x, 3, None, "mean", torch.float16,
        ((x, [y, 2.0]), {"out": x, "alpha": 1}),
        [[x], (), [], {}, (y,)],
        {"b": y, "a": [x, None]},  # insertion order, not sorted
        Pair(x, [y]), OrderedDict(z=x, a=y),
        torch.max(torch.ones(2, 2), dim=0), (values, indices),
        torch.Size([2, 3]), (torch.Size([4]), [torch.Size([])]),
    ]
    for tree in trees:
        found, expected = leaves(tree), tree_flatten(tree)[0]
        assert len(found) == len(expected) and all(a is b for a, b in zip(found, expected)), tree


def test_leaves_stop_where_is_leaf_says():
    x, y = torch.ones(2), torch.zeros(3)
    tree = ((x, [x, y]), {"lists": [y]}, Pair([x], 1))
    is_list = lambda value: isinstance(value, list)  # noqa: E731
    found, expected = leaves(tree, is_list), tree_flatten(tree, is_leaf=is_list)[0]
    assert len(found) == len(expected) == 5
    assert all(a is b for a, b in zip(found, expected))
    assert found[1] == [x, y] and found[3] == [x]
