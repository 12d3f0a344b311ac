"""NamedArray: declaration, access, indexing, combining, conversion and pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from api.errors import NamedArrayError
from api.namedarray import NamedArray, concatenate, from_flat, namedarray, stack


@namedarray
class Memory:
    hx: np.ndarray


@namedarray
class Step:
    obs: np.ndarray
    reward: np.ndarray | None = None
    memory: Memory | None = None


class Declared(NamedArray):
    a: np.ndarray
    b: np.ndarray | None = None


def make_step(batch: int = 4) -> Step:
    return Step(
        obs=np.arange(batch * 3, dtype=np.float32).reshape(batch, 3),
        reward=np.arange(batch, dtype=np.float32),
        memory=Memory(hx=np.ones((batch, 2), dtype=np.float32)),
    )


def test_declaration_orders_fields_and_fills_defaults():
    s = Step(obs=np.zeros(2))
    assert s.keys() == ["obs", "reward", "memory"]
    assert s.reward is None and s.memory is None
    assert Declared(np.zeros(1)).keys() == ["a", "b"]


def test_positional_and_keyword_construction_agree():
    a, b = np.zeros(3), np.ones(3)
    assert Declared(a, b).b is b
    assert Declared(a=a, b=b).a is a


def test_unknown_field_in_constructor_names_declared_fields():
    with pytest.raises(NamedArrayError, match=r"Step has no field 'rewrd'; declared fields are"):
        Step(obs=np.zeros(1), rewrd=np.zeros(1))


def test_too_many_positional_values():
    with pytest.raises(NamedArrayError, match="Declared takes 2 fields, got 3 positional values"):
        Declared(1, 2, 3)


def test_generic_namedarray_takes_any_keyword_fields():
    g = NamedArray(x=np.zeros(2), y=None)
    assert g.keys() == ["x", "y"]
    with pytest.raises(NamedArrayError, match="keyword fields only"):
        NamedArray(np.zeros(2))


def test_attribute_and_item_access_return_the_same_leaf():
    s = make_step()
    assert s.obs is s["obs"]
    assert s.memory.hx is s["memory"]["hx"]
    assert "obs" in s and "value" not in s


def test_missing_field_access_errors_name_the_fields():
    s = make_step()
    with pytest.raises(AttributeError, match="Step has no field 'value'"):
        _ = s.value
    with pytest.raises(KeyError, match="Step has no field 'value'"):
        _ = s["value"]


def test_assigning_undeclared_field_is_an_error():
    s = make_step()
    with pytest.raises(NamedArrayError, match="cannot assign undeclared field 'value' on Step"):
        s.value = np.zeros(4)


def test_assigning_declared_field_by_attribute_and_item():
    s = make_step()
    s.reward = np.full(4, 2.0)
    s["obs"] = np.zeros((4, 3))
    assert s.reward[0] == 2.0 and s.obs.sum() == 0


@pytest.mark.parametrize(
    "key, rows",
    [
        (1, None),
        (slice(1, 3), [1, 2]),
        (np.array([0, 3]), [0, 3]),
        (np.array([True, False, True, False]), [0, 2]),
    ],
    ids=["int", "slice", "int-array", "bool-mask"],
)
def test_indexing_applies_to_every_leaf_and_keeps_the_type(key, rows):
    s = make_step()
    part = s[key]
    assert type(part) is Step
    assert type(part.memory) is Memory
    if rows is None:
        assert part.obs.shape == (3,) and part.reward.shape == ()
        np.testing.assert_array_equal(part.obs, s.obs[1])
    else:
        np.testing.assert_array_equal(part.obs, s.obs[rows])
        np.testing.assert_array_equal(part.reward, s.reward[rows])
        np.testing.assert_array_equal(part.memory.hx, s.memory.hx[rows])


def test_indexing_keeps_none_fields_none():
    s = Step(obs=np.zeros((3, 2)))
    assert s[0:2].reward is None and s[0:2].memory is None


def test_row_assignment_writes_every_leaf():
    s = make_step()
    s[1:3] = Step(obs=np.zeros((2, 3)), reward=np.zeros(2), memory=Memory(hx=np.zeros((2, 2))))
    assert s.obs[1:3].sum() == 0 and s.memory.hx[1:3].sum() == 0
    assert s.obs[0].sum() == 3.0


def test_len_and_shape_and_dtype():
    s = make_step()
    assert len(s) == 4
    assert s.shape == {"obs": (4, 3), "reward": (4,), "memory": {"hx": (4, 2)}}
    assert s.dtype["memory"]["hx"] == np.float32
    with pytest.raises(TypeError, match="only None fields has no length"):
        len(Step(obs=None))


def test_stack_adds_a_batch_axis_to_every_leaf():
    s = stack([make_step()[i] for i in range(4)])
    assert type(s) is Step
    np.testing.assert_array_equal(s.obs, make_step().obs)
    assert s.memory.hx.shape == (4, 2)


def test_concatenate_joins_along_the_batch_axis():
    s = concatenate([make_step(2), make_step(3)])
    assert s.obs.shape == (5, 3) and s.memory.hx.shape == (5, 2) and s.reward.shape == (5,)


def test_stack_error_names_field_and_both_shapes():
    a = Step(obs=np.zeros(3))
    b = Step(obs=np.zeros(4))
    with pytest.raises(NamedArrayError) as e:
        stack([a, b])
    assert str(e.value) == (
        "cannot stack field 'obs': entry 0 has shape (3,), entry 1 has shape (4,)"
    )


def test_concatenate_error_names_nested_field_and_both_shapes():
    a = make_step(2)
    b = make_step(2)
    b.memory = Memory(hx=np.ones((2, 5)))
    with pytest.raises(NamedArrayError) as e:
        concatenate([a, b])
    assert str(e.value) == (
        "cannot concatenate field 'memory.hx': entry 0 has shape (2, 2), entry 1 has shape (2, 5)"
    )


def test_combining_none_with_a_value_is_an_error():
    with pytest.raises(NamedArrayError, match="field 'reward': it is None in entry 1"):
        stack([Step(obs=np.zeros(1), reward=np.zeros(1)), Step(obs=np.zeros(1))])


def test_combining_different_fields_is_an_error():
    with pytest.raises(NamedArrayError, match="entry 0 has fields"):
        stack([NamedArray(a=np.zeros(1)), NamedArray(b=np.zeros(1))])


def test_combining_nothing_is_an_error():
    with pytest.raises(NamedArrayError, match="cannot stack an empty list"):
        stack([])


def test_to_dict_and_from_dict_round_trip_with_nested_types():
    s = make_step()
    d = s.to_dict()
    assert set(d) == {"obs", "reward", "memory"} and set(d["memory"]) == {"hx"}
    back = Step.from_dict(d)
    assert type(back) is Step and type(back.memory) is Memory
    np.testing.assert_array_equal(back.memory.hx, s.memory.hx)


def test_apply_maps_every_non_none_leaf():
    s = Step(obs=np.ones((2, 3)), memory=Memory(hx=np.ones((2, 2))))
    doubled = s.apply(lambda x: x * 2)
    assert type(doubled) is Step
    assert doubled.obs.sum() == 12 and doubled.memory.hx.sum() == 8 and doubled.reward is None
    assert s.obs.sum() == 6  # the original is untouched


def test_flatten_and_from_flat_rebuild_a_generic_namedarray():
    s = make_step()
    flat = dict(s.flatten())
    assert list(flat) == ["obs", "reward", "memory.hx"]
    rebuilt = from_flat(s.structure(), flat)
    assert rebuilt.keys() == s.keys()
    np.testing.assert_array_equal(rebuilt.memory.hx, s.memory.hx)


def test_pickling_keeps_type_and_values():
    s = make_step()
    back = pickle.loads(pickle.dumps(s))
    assert type(back) is Step and type(back.memory) is Memory
    np.testing.assert_array_equal(back.obs, s.obs)
    assert back.keys() == s.keys()


def test_torch_leaves_index_and_stack():
    torch = pytest.importorskip("torch")
    s = NamedArray(x=torch.zeros(4, 2))
    assert s[1:3].x.shape == (2, 2)
    assert stack([s, s]).x.shape == (2, 4, 2)
