"""The one kind of table the package looks names up in (tinymcf_callback/registry.py), and the tables built on it:
layouts, weight formats with their loaders, the served reload routes."""

from __future__ import annotations

import sys

import pytest

from tinymcf_callback.errors import RegistryError
from tinymcf_callback.registry import Registry, resolve


def test_entries_keep_their_order_and_a_new_one_goes_before_the_one_named():
    table = Registry("colour")
    table.register("red", 1)
    table.register("blue", 3)
    table.register("green", 2, before="blue")
    table.register("grey", 4, before="not there")  # no such entry: last
    assert table.names() == ["red", "green", "blue", "grey"] and table.values() == [1, 2, 3, 4]
    assert "green" in table and "pink" not in table and len(table) == 4 and list(table) == table.names()


def test_a_name_given_twice_is_refused_and_a_missing_one_lists_the_names():
    table = Registry("colour")
    table.register("red", 1)
    with pytest.raises(RegistryError) as twice:
        table.register("red", 1)  # even the same entry: two registrations would decide one thing
    assert "'red'" in str(twice.value) and table["red"] == 1
    with pytest.raises(RegistryError) as missing:
        table["blue"]
    assert "'blue'" in str(missing.value) and "red" in str(missing.value)


def test_a_lazy_entry_is_imported_on_first_use_only(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    table = Registry("conversion")
    table.register("hls", "colorsys:rgb_to_hls")
    assert "colorsys" not in sys.modules  # registering imports nothing
    import colorsys

    assert table["hls"] is colorsys.rgb_to_hls and table.values() == [colorsys.rgb_to_hls]
    with pytest.raises(RegistryError, match="nosuch"):
        resolve("colorsys:nosuch")
    with pytest.raises(RegistryError):
        resolve("colorsys")  # no attribute named


def test_scoped_registrations_are_gone_after_the_block_and_nothing_earlier_is_lost():
    table = Registry("colour")
    table.register("red", 1)
    with table.scoped():
        table.register("blue", 2, before="red")
        assert table.names() == ["blue", "red"]
    assert table.names() == ["red"]
    with pytest.raises(KeyError), table.scoped():
        table.register("blue", 2)
        raise KeyError("a failing test")
    assert table.names() == ["red"]


def test_every_weight_format_brings_its_loader_and_every_layout_its_formats():
    from tinymcf_callback.rundir.checkpoints import FORMATS
    from tinymcf_callback.rundir.layouts import LAYOUTS, PLAIN

    assert LAYOUTS.names()[-1] == PLAIN  # the catch-all, tried last
    for layout in LAYOUTS.values():
        assert all(FORMATS[form.name] == form for form in layout.formats), layout.name
    for form in FORMATS.values():
        assert callable(resolve(form.loader)), form.name


def test_the_reload_routes_are_one_table():
    from tinymcf_callback.served.reload import RELOADS, Reloader, reloads_adapter

    assert RELOADS.names() == ["vllm", "sglang", "lora"]
    assert [reloads_adapter(name) for name in (*RELOADS, "python restart.py {checkpoint}", None)] == [
        False, False, True, False, False]
    assert Reloader("lora", "http://127.0.0.1:1").builtin and not Reloader("echo {checkpoint}").builtin
