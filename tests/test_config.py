"""``codetool.config``: how a YAML or command-line value becomes the annotated type, branch by branch.

``_coerce`` is the one place a recipe's text turns into typed settings, so every form it accepts
and every value it refuses is pinned here: bools, numbers (bools and non-integral floats refused
for integers), ``none``/``null`` for optional fields, lists from comma-separated text or YAML,
tuples, mappings, ``Literal`` and ``choices``, nested dataclasses, and unknown keys with the
closest valid key as a hint.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from codetool.config import (
    ConfigError,
    Unread,
    _coerce,
    config_hash,
    from_dict,
    load_config,
    option,
    renamed_error,
    section,
    unread_keys,
)
from codetool.config_args import add_arguments, config_from_args


@dataclass
class Inner:
    k: int = option(2, "candidates")
    name: str = option("x", "a name")


@dataclass
class Outer:
    flag: bool = option(False, "a switch")
    n: int = option(1, "a count")
    lr: float = option(0.1, "a rate")
    maybe: int | None = option(None, "an optional count")
    tags: list[str] = option(default_factory=list, help="names")
    sizes: tuple[int, ...] = option(default_factory=tuple, help="sizes")
    weights: dict[str, float] = option(default_factory=dict, help="weights by name")
    mode: Literal["a", "b"] = option("a", "a literal")
    pick: str = option("x", "one of two", choices=("x", "y"))
    inner: Inner = option(default_factory=Inner, help="a group")
    anything: Any = option(None, "no type")
    max_steps: int = option(5, "steps")

    config_renamed = {"steps": "max_steps", "options": "its keys are this config's own keys now"}


# -- bool ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["true", "True", "YES", "1", "on", "On"])
def test_bool_true_forms(text):
    assert _coerce(text, bool, "flag") is True


@pytest.mark.parametrize("text", ["false", "FALSE", "no", "0", "off"])
def test_bool_false_forms(text):
    assert _coerce(text, bool, "flag") is False


def test_bool_keeps_bools_and_reads_the_integers_zero_and_one():
    assert _coerce(True, bool, "flag") is True and _coerce(False, bool, "flag") is False
    assert _coerce(1, bool, "flag") is True and _coerce(0, bool, "flag") is False


@pytest.mark.parametrize("value", [2, -1, 1.0, "maybe", "", [True]])
def test_bool_refuses_anything_else(value):
    with pytest.raises(ConfigError, match=r"^flag: expected true or false, got "):
        _coerce(value, bool, "flag")


# -- int and float ---------------------------------------------------------------------------------

def test_int_from_text_and_from_integral_floats():
    assert _coerce("3", int, "n") == 3 and type(_coerce("3", int, "n")) is int
    assert _coerce(3.0, int, "n") == 3 and type(_coerce(3.0, int, "n")) is int
    assert _coerce(-7, int, "n") == -7


@pytest.mark.parametrize("value", [True, False])
def test_numbers_refuse_bools(value):
    for tp in (int, float):
        with pytest.raises(ConfigError, match=rf"^n: expected a number, got {value}\.$"):
            _coerce(value, tp, "n")


def test_int_refuses_non_integral_floats_and_non_numbers():
    with pytest.raises(ConfigError, match=r"^n: expected an integer, got 3\.5\.$"):
        _coerce(3.5, int, "n")
    with pytest.raises(ConfigError, match=r"^n: expected an integer, got '3\.0'\.$"):
        _coerce("3.0", int, "n")  # int("3.0") fails: text must be an integer literal
    for value in ("three", [1], {"a": 1}, math.nan):
        with pytest.raises(ConfigError, match=r"^n: expected an integer, got "):
            _coerce(value, int, "n")


def test_int_refuses_infinity_with_a_config_error():
    with pytest.raises(ConfigError, match=r"^n: expected an integer, got inf\.$"):
        _coerce(math.inf, int, "n")


def test_float_from_text_and_integers():
    assert _coerce("1e-6", float, "lr") == 1e-6
    assert _coerce(2, float, "lr") == 2.0 and type(_coerce(2, float, "lr")) is float
    with pytest.raises(ConfigError, match=r"^lr: expected a number, got 'fast'\.$"):
        _coerce("fast", float, "lr")


# -- none / null -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [None, "none", "None", "NULL", "null"])
def test_optional_fields_read_none_and_null(value):
    assert _coerce(value, int | None, "maybe") is None


def test_optional_fields_still_convert_a_value():
    assert _coerce("5", int | None, "maybe") == 5
    assert _coerce("none", Literal["a", "none"] | None, "m") is None  # the null words win for optional fields


def test_a_required_field_refuses_null():
    with pytest.raises(ConfigError, match=r"^n: got no value \(null\); expected int\.$"):
        _coerce(None, int, "n")


def test_null_words_are_text_for_required_and_untyped_fields():
    assert _coerce("none", str, "s") == "none"
    assert _coerce("null", Any, "a") == "null"
    assert _coerce(None, Any, "a") is None


# -- text ------------------------------------------------------------------------------------------

def test_text_from_scalars_and_not_from_containers():
    assert _coerce(5, str, "s") == "5" and _coerce(True, str, "s") == "True" and _coerce(1.5, str, "s") == "1.5"
    for value in ({"a": 1}, ["a"]):
        with pytest.raises(ConfigError, match=r"^s: expected text, got "):
            _coerce(value, str, "s")


# -- lists and tuples ------------------------------------------------------------------------------

def test_lists_from_comma_separated_text():
    assert _coerce("a, b,,c ", list[str], "tags") == ["a", "b", "c"]
    assert _coerce("", list[str], "tags") == []
    assert _coerce("1,2", list[int], "sizes") == [1, 2]


def test_lists_from_yaml_text():
    assert _coerce("[1, 2]", list[int], "sizes") == [1, 2]
    assert _coerce(" [a, 'b, c']", list[str], "tags") == ["a", "b, c"]
    assert _coerce("[1]", list[str], "tags") == ["1"]  # items take the item type


def test_lists_refuse_broken_yaml_text_in_one_line():
    with pytest.raises(ConfigError, match=r"^tags: '\[a, b' is not valid YAML"):
        _coerce("[a, b", list[str], "tags")


def test_a_scalar_becomes_a_one_item_list_and_items_are_checked_by_position():
    assert _coerce(5, list[int], "sizes") == [5]
    assert _coerce({"a": 1}, list, "x") == [{"a": 1}]
    with pytest.raises(ConfigError, match=r"^sizes\[1\]: expected an integer, got 'x'\.$"):
        _coerce(["1", "x"], list[int], "sizes")


def test_tuples_and_bare_lists_become_lists():
    assert _coerce("1, 2", tuple[int, ...], "sizes") == [1, 2]
    assert _coerce((1, 2), list[int], "sizes") == [1, 2]
    assert _coerce("a,b", list, "x") == ["a", "b"]
    assert _coerce(["1", 2], tuple, "x") == ["1", 2]  # no item type: items kept as they are


# -- mappings --------------------------------------------------------------------------------------

def test_mappings_from_dicts_and_yaml_text():
    assert _coerce({"a": "0.5", 1: 2}, dict[str, float], "w") == {"a": 0.5, "1": 2.0}
    assert _coerce("{a: 1}", dict[str, float], "w") == {"a": 1.0}
    assert _coerce({"a": [1]}, dict, "w") == {"a": [1]}
    with pytest.raises(ConfigError, match=r"^w\.b: expected a number, got 'x'\.$"):
        _coerce({"b": "x"}, dict[str, float], "w")


def test_mappings_refuse_other_values():
    for value in ("a", ["a"], 3):
        with pytest.raises(ConfigError, match=r"^w: expected a mapping, got "):
            _coerce(value, dict[str, float], "w")
    with pytest.raises(ConfigError, match=r"^w: '\{a: 1' is not valid YAML"):
        _coerce("{a: 1", dict[str, float], "w")


# -- Literal and choices ---------------------------------------------------------------------------

def test_literal_values():
    assert _coerce("b", Literal["a", "b"], "mode") == "b"
    with pytest.raises(ConfigError, match=r"^mode: got 'c'; choose one of \['a', 'b'\]\.$"):
        _coerce("c", Literal["a", "b"], "mode")
    assert _coerce(None, Literal["a", "b"] | None, "mode") is None


def test_choices_are_checked_after_conversion():
    assert from_dict(Outer, {"pick": "y"}).pick == "y"
    with pytest.raises(ConfigError, match=r"^pick: got 'z'; choose one of \['x', 'y'\]\.$"):
        from_dict(Outer, {"pick": "z"})


# -- nested dataclasses ----------------------------------------------------------------------------

def test_nested_groups_from_mappings_and_instances():
    cfg = from_dict(Outer, {"inner": {"k": "5"}})
    assert cfg.inner == Inner(k=5, name="x")
    given = Inner(k=9)
    assert _coerce(given, Inner, "inner") is given
    assert _coerce(given, Inner | None, "inner") is given


def test_nested_groups_refuse_scalars_and_name_the_dotted_key():
    with pytest.raises(ConfigError, match=r"^inner: expected a mapping of Inner settings, got '5'\.$"):
        from_dict(Outer, {"inner": "5"})
    with pytest.raises(ConfigError, match=r"^inner\.k: expected an integer, got 'many'\.$"):
        from_dict(Outer, {"inner": {"k": "many"}})


@dataclass
class Shaped:
    """A group whose field default differs from its class defaults, and one key it never reads."""

    inner: Inner = option(default_factory=lambda: Inner(k=7, name="shaped"), help="a group")

    config_unread = {"inner": Unread(reader="shaping", reads=("k",),
                                     homes={"name": "Names are given to {group}label: set that instead."})}


def test_a_group_given_in_part_keeps_its_field_defaults_for_the_rest():
    """``inner: {k: 3}`` keeps what the field's default_factory sets for the other read keys (before,
    the group was rebuilt from the class defaults: a tree's max_new_tokens 192 became 256 as soon as
    a recipe set trees.search.temperature). A key the config does not read keeps its class default."""
    assert Shaped().inner == Inner(k=7, name="shaped")
    assert from_dict(Shaped, {"inner": {}}).inner == Inner(k=7, name="x")
    assert from_dict(Outer, {"inner": {"name": "y"}}).inner == Inner(k=2, name="y")  # a plain factory: class defaults


def test_a_key_the_config_does_not_read_is_refused_with_where_it_belongs():
    with pytest.raises(ConfigError, match=r"^inner\.name is not read by shaping; it reads inner: k\. Names are "
                                          r"given to label: set that instead\.$"):
        from_dict(Shaped, {"inner": {"k": 1, "name": "z"}})
    with pytest.raises(ConfigError, match=r"^outer\.inner\.name is not read by shaping; it reads outer\.inner: k\. "
                                          r"Names are given to outer\.label"):
        from_dict(Shaped, {"inner": {"name": "z"}}, where="outer")
    assert from_dict(Shaped, {"inner": {"k": 1}}).inner.k == 1
    assert unread_keys(Shaped) == {"inner.name"}


def test_an_unread_flag_is_parsed_but_left_out_of_the_help(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser, Shaped)
    assert "--inner.name" not in parser.format_help() and "--inner.k" in parser.format_help()
    with pytest.raises(ConfigError, match=r"^inner\.name is not read by shaping"):
        config_from_args(Shaped, parser.parse_args(["--inner.name", "z"]))


# -- unknown keys ----------------------------------------------------------------------------------

def test_an_unknown_key_names_the_closest_valid_key_and_lists_the_valid_ones():
    with pytest.raises(ConfigError, match=r"^unknown config key 'falg'\. Did you mean 'flag'\? \(valid keys: "
                                          r"anything, flag, inner, lr, max_steps, maybe, mode, n, pick, sizes, "
                                          r"tags, weights\)$"):
        from_dict(Outer, {"falg": True})
    with pytest.raises(ConfigError, match=r"^unknown config key 'inner\.kk'\. Did you mean 'k'\?"):
        from_dict(Outer, {"inner": {"kk": 1}})


def test_did_you_mean_names_every_option_about_as_close_as_the_closest():
    from codetool.config import did_you_mean

    assert did_you_mean("querys", ["query", "queries", "router", "tools"], spell="--{}") == (
        " Did you mean '--query' or '--queries'?")
    assert did_you_mean("abcd", ["abce", "abcf", "abcg", "abch"]) == " Did you mean 'abch', 'abcg' or 'abcf'?"  # 3 at most
    assert did_you_mean("polcy", ["policy", "port"]) == " Did you mean 'policy'?"  # port: far from the closest
    assert did_you_mean("zzz", ["policy"]) == ""


def test_an_unknown_key_far_from_every_valid_one_gets_no_hint():
    with pytest.raises(ConfigError) as e:
        from_dict(Outer, {"zzzzzz": 1})
    assert str(e.value).startswith("unknown config key 'zzzzzz'. (valid keys: ")


def test_dashes_and_underscores_name_the_same_field():
    assert from_dict(Outer, {"max-steps": "7"}).max_steps == 7
    assert from_dict(Outer, {"max_steps": 8}).max_steps == 8


def test_untyped_and_unknown_annotations_pass_through():
    assert _coerce({"x": 1}, Any, "a") == {"x": 1}
    assert _coerce("5", int | str, "u") == "5"  # a union of several types is not guessed at
    assert _coerce("p", Path, "p") == "p"


# -- load_config and the command line --------------------------------------------------------------

def test_load_config_layers_defaults_yaml_and_dotted_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("n: 3\ntags: [a, b]\ninner: {k: 4, name: y}\n")
    cfg = load_config(Outer, recipe, {"inner.k": "6", "flag": "yes", "weights": "{a: 2}"})
    assert (cfg.n, cfg.tags, cfg.inner, cfg.flag, cfg.weights) == (3, ["a", "b"], Inner(6, "y"), True, {"a": 2.0})
    with pytest.raises(ConfigError, match=r"^--n\.k: 'n' is a value, not a group of settings\.$"):
        load_config(Outer, recipe, {"n": 1, "n.k": 1})
    with pytest.raises(ConfigError, match=r"^n: expected an integer, got \{'k': 1\}\.$"):
        load_config(Outer, recipe, {"n.k": 1})  # the recipe's value is replaced by the group, then refused


@pytest.mark.parametrize("text", ["", "  \n\t\n", "# only a comment\n# and another\n", "---\n", "null\n"])
def test_an_empty_recipe_is_refused_naming_the_file_and_what_to_put_in_it(tmp_path, text):
    """An empty --config (blank, comments only, a bare document) is a mistake, not "every default"."""
    recipe = tmp_path / "empty.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=r"^.*empty\.yaml: the recipe is empty \(blank or comments only\); put "
                                          r"settings in it as a YAML mapping .*leave --config out"):
        load_config(Outer, recipe)
    recipe.write_text("{}\n")  # an explicit empty mapping says "the defaults" on purpose
    assert load_config(Outer, recipe) == Outer()


@dataclass
class Checked:
    steps: int = option(1, "steps")
    k: int = option(1, "k")

    def __post_init__(self):
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}.")
        if self.k < 1:
            raise ConfigError(f"grp.k must be >= 1, got {self.k}.")  # names its key itself, as search.k does


@dataclass
class Holder:
    grp: Checked = option(default_factory=Checked, help="a group that checks itself")


def test_a_nested_group_s_check_names_the_dotted_key():
    """``--search.max_steps -3`` said "max_steps must be >= 1" while ``search.k`` said "search.k ...":
    a check read below a key is dotted where its message starts with a bare key of the group."""
    with pytest.raises(ConfigError, match=r"^grp\.steps must be >= 1, got -3\.$"):
        load_config(Holder, None, {"grp.steps": "-3"})
    with pytest.raises(ConfigError, match=r"^grp\.k must be >= 1, got 0\.$"):  # not grp.grp.k
        load_config(Holder, None, {"grp.k": "0"})
    with pytest.raises(ConfigError, match=r"^steps must be >= 1, got 0\.$"):  # at the top: no prefix
        load_config(Checked, None, {"steps": "0"})


def test_command_line_flags_reach_the_config_through_the_same_conversion():
    parser = argparse.ArgumentParser()
    add_arguments(parser, Outer)
    cfg = config_from_args(Outer, parser.parse_args(["--flag", "--max-steps", "4", "--inner.k", "3",
                                                     "--tags", "a,b", "--maybe", "none"]))
    assert (cfg.flag, cfg.max_steps, cfg.inner.k, cfg.tags, cfg.maybe) == (True, 4, 3, ["a", "b"], None)
    cfg = config_from_args(Outer, parser.parse_args(["--flag", "false", "--max_steps", "2"]))
    assert (cfg.flag, cfg.max_steps) == (False, 2)


def test_config_hash_is_stable_and_ignores_named_keys():
    a, b = Outer(n=2), Outer(n=2, tags=["x"])
    assert config_hash(a) == config_hash(Outer(n=2)) and len(config_hash(a)) == 12
    assert config_hash(a) != config_hash(b)
    assert config_hash(a, ignore=["tags"]) == config_hash(b, ignore=["tags"])


# -- keys renamed in 0.2.0 and sections ------------------------------------------------------------

def test_a_renamed_key_is_refused_naming_the_new_one():
    with pytest.raises(ConfigError, match=r"^train\.steps was renamed to train\.max_steps in 0\.2\.0 "
                                          r"\(docs/MIGRATING\.md\)\.$"):
        from_dict(Outer, {"steps": 3}, where="train")
    with pytest.raises(ConfigError, match=r"^steps was renamed to max_steps in 0\.2\.0"):
        load_config(Outer, None, {"steps": 3})


def test_a_removed_key_says_what_replaced_it():
    with pytest.raises(ConfigError, match=r"^options was removed in 0\.2\.0: its keys are this config's own keys "
                                          r"now \(docs/MIGRATING\.md\)\.$"):
        from_dict(Outer, {"options": {"max_steps": 1}})


def test_a_renamed_flag_gets_the_same_line_with_dashes():
    assert str(renamed_error(Outer, "steps", flag=True)) == (
        "--steps was renamed to --max_steps in 0.2.0 (docs/MIGRATING.md).")
    assert str(renamed_error(Outer, "inner.k", flag=True) or "") == ""  # not a renamed key
    parser = argparse.ArgumentParser()
    add_arguments(parser, Outer)
    assert "--steps" not in parser.format_help()  # not an option of its own any more


@dataclass
class WithSection:
    n: int = option(1, "a count")
    fmt: Any = section("codetool.prm.format:PRMFormat", "a config imported when built")


def test_a_section_is_built_from_a_mapping_and_checks_its_own_keys():
    from codetool.prm.format import PRMFormat

    cfg = load_config(WithSection, None, {"fmt.max_length": "3000"})
    assert isinstance(cfg.fmt, PRMFormat) and cfg.fmt.max_length == 3000 and WithSection().fmt == PRMFormat()
    with pytest.raises(ConfigError, match=r"^unknown config key 'fmt\.max_lenght'\. Did you mean 'max_length'\?"):
        load_config(WithSection, None, {"fmt.max_lenght": 1})


def test_a_section_has_one_help_line_and_takes_any_of_its_keys_from_the_command_line():
    from codetool.cli import _section_options

    parser = argparse.ArgumentParser()
    add_arguments(parser, WithSection)
    assert "--fmt.KEY VALUE" in parser.format_help() and "--fmt.max_length" not in parser.format_help()
    found, rest = _section_options(WithSection, ["--fmt.max_length", "300", "--fmt.interface=ours", "--n", "2",
                                                 "--fmt.flag", "--fmt.low", "-1"])
    assert found == {"fmt.max_length": "300", "fmt.interface": "ours", "fmt.flag": "true", "fmt.low": "-1"}
    assert rest == ["--n", "2"]
