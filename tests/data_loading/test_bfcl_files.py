"""BFCL's own files, as BFCL v4 ships them: every single-turn category loads with its category
and ground truth, and for every row the ground-truth call scores 1 and a wrong call 0 (through
the env, and through the `bfcl_ast` reward)."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
from toolrl.envs.function_calling import load_tasks

from toolrl.cli import main
from toolrl.core.bfcl import check_mode, ground_truth_calls
from toolrl.core.env import run_episode
from toolrl.core.parse import get_format
from toolrl.core.registration import make_env
from toolrl.core.types import ToolCall
from toolrl.data.bfcl import LANGUAGE_HINT, load_bfcl
from toolrl.reward import build_reward

HERMES = get_format("hermes")


def fn(name, props, required, desc="d"):
    return {"name": name, "description": desc,
            "parameters": {"type": "dict", "properties": props, "required": required}}


def entry(entry_id, question, functions):
    return {"id": entry_id, "question": [[{"role": "user", "content": question}]],
            "function": functions}


S, I, F, B = (  # noqa: E741
    {"type": "string"}, {"type": "integer"}, {"type": "float"}, {"type": "boolean"})
TRIANGLE = fn("calculate_triangle_area", {"base": I, "height": I, "unit": S}, ["base", "height"])
HYPOT = fn("math.hypot", {"x": I, "y": I, "z": I}, ["x", "y"])
PROPS = fn("triangle_properties.get", {"side1": I, "side2": I, "side3": I, "get_area": B},
           ["side1", "side2", "side3"])
PLAY = fn("spotify.play", {"artist": S, "duration": I}, ["artist", "duration"])
MULTIPLES = fn("math_toolkit.sum_of_multiples", {
    "lower_limit": I, "upper_limit": I, "multiples": {"type": "array", "items": I}},
    ["lower_limit", "upper_limit", "multiples"])
PRIMES = fn("math_toolkit.product_of_primes", {"count": I}, ["count"])
BMI = fn("determine_body_mass_index", {"weight": F, "height": F}, ["weight", "height"])
USER = fn("get_user_info", {"user_id": I, "special": S}, ["user_id"])
STAR = fn("github_star", {"repos": S, "aligned": S}, ["repos"])
DRINK = fn("ChaDri.change_drink", {"drink_id": S, "new_preferences": {
    "type": "dict", "properties": {"size": S, "milk_type": S, "temperature": S}}},
    ["drink_id"])
FOOD = fn("ChaFod", {"foodItem": S, "removeIngredients": S}, ["foodItem"])
SHOP = fn("search_products", {"category": S, "brand": S, "price_max": F}, ["category"])
WEATHER = fn("get_current_weather", {"location": S, "unit": S}, ["location"])
GET = fn("requests.get", {"url": S, "params": {"type": "dict", "properties": {}}}, ["url"])
SEARCH = fn("search_engine.query", {"prompt": S}, ["prompt"])

# category -> [(question entry, ground truth or None)]; two entries per category
CASES = {
    "simple_python": [
        (entry("simple_python_0", "Area of a triangle with base 10 and height 5?", [TRIANGLE]),
         [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]),
        (entry("simple_python_1", "Euclidean norm of (4, 5).", [HYPOT]),
         [{"math.hypot": {"x": [4], "y": [5], "z": ["", 0]}}]),
    ],
    "multiple": [
        (entry("multiple_0", "Properties of a 5-4-3 triangle?", [PROPS, TRIANGLE]),
         [{"triangle_properties.get": {"side1": [5], "side2": [4], "side3": [3],
                                       "get_area": ["", True]}}]),
        (entry("multiple_1", "Area of base 3 height 4?", [PROPS, TRIANGLE]),
         [{"calculate_triangle_area": {"base": [3], "height": [4], "unit": [""]}}]),
    ],
    "parallel": [
        (entry("parallel_0", "Play Taylor Swift 20 min and Maroon 5 15 min.", [PLAY]),
         [{"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}},
          {"spotify.play": {"artist": ["Maroon 5"], "duration": [15]}}]),
        (entry("parallel_1", "Play Adele 5 min and Queen 7 min.", [PLAY]),
         [{"spotify.play": {"artist": ["Adele"], "duration": [5]}},
          {"spotify.play": {"artist": ["Queen"], "duration": [7]}}]),
    ],
    "parallel_multiple": [
        (entry("parallel_multiple_0", "Sum of multiples of 3 and 5 in 1..1000; product of "
               "the first five primes.", [MULTIPLES, PRIMES]),
         [{"math_toolkit.sum_of_multiples": {"lower_limit": [1], "upper_limit": [1000],
                                             "multiples": [[3, 5]]}},
          {"math_toolkit.product_of_primes": {"count": [5]}}]),
        (entry("parallel_multiple_1", "Product of the first 3 primes and of the first 4.",
               [MULTIPLES, PRIMES]),
         [{"math_toolkit.product_of_primes": {"count": [3]}},
          {"math_toolkit.product_of_primes": {"count": [4]}}]),
    ],
    "irrelevance": [
        (entry("irrelevance_0", "Area of a triangle with base 10 m and height 5 m?", [BMI]),
         None),
        (entry("irrelevance_1", "Who wrote Hamlet?", [BMI]), None),
    ],
    "live_simple": [
        (entry("live_simple_0-0-0", "Details of user 7890, special request black?", [USER]),
         [{"get_user_info": {"user_id": [7890], "special": ["black"]}}]),
        # a variable answer: the schema says string, the answer is a boolean
        (entry("live_simple_1-1-0", "Star my repos, aligned.", [STAR]),
         [{"github_star": {"repos": ["ShishirPatil/gorilla"], "aligned": [True]}}]),
    ],
    "live_multiple": [
        # a nested dict answer in possible-answer form
        (entry("live_multiple_0-0-0", "Make drink latte large with coconut milk, hot.",
               [FOOD, DRINK]),
         [{"ChaDri.change_drink": {"drink_id": ["latte"], "new_preferences": [
             {"size": ["large"], "milk_type": ["coconut"], "temperature": ["hot", ""]}]}}]),
        # null listed among the acceptable values
        (entry("live_multiple_1-1-0", "Find laptops.", [SHOP, FOOD]),
         [{"search_products": {"category": ["laptops"], "brand": ["", None],
                               "price_max": ["", None]}}]),
    ],
    "live_parallel": [
        (entry("live_parallel_0-0-0", "Weather in Beijing and in Shanghai?", [WEATHER]),
         [{"get_current_weather": {"location": ["Beijing, China"], "unit": ["", "celsius"]}},
          {"get_current_weather": {"location": ["Shanghai, China"], "unit": ["", "celsius"]}}]),
        (entry("live_parallel_1-0-1", "Weather in Boston and Paris, in fahrenheit?", [WEATHER]),
         [{"get_current_weather": {"location": ["Boston, MA"], "unit": ["fahrenheit"]}},
          {"get_current_weather": {"location": ["Paris, France"], "unit": ["fahrenheit"]}}]),
    ],
    "live_parallel_multiple": [
        (entry("live_parallel_multiple_0-0-0", "Caesar salad without anchovies; drink 123 "
               "large hot.", [FOOD, DRINK]),
         [{"ChaFod": {"foodItem": ["Caesar salad"], "removeIngredients": ["anchovies"]}},
          {"ChaDri.change_drink": {"drink_id": ["123"], "new_preferences": [
              {"size": ["large"], "temperature": ["hot"]}]}}]),
        (entry("live_parallel_multiple_1-1-0", "Weather in Rome; laptops.", [WEATHER, SHOP]),
         [{"get_current_weather": {"location": ["Rome, Italy"]}},
          {"search_products": {"category": ["laptops"]}}]),
    ],
    "live_irrelevance": [
        (entry("live_irrelevance_0-0-0", "Tell me a joke.", [GET]), None),
        (entry("live_irrelevance_1-0-1", "What is 2 + 2?", [GET, SEARCH]), None),
    ],
    "live_relevance": [
        (entry("live_relevance_0-0-0", "Find a digital painting of a masked woman.", [SEARCH]),
         None),
        (entry("live_relevance_1-1-0", "Search the news about Mars.", [SEARCH, GET]), None),
    ],
}


@pytest.fixture(scope="module")
def bfcl_dir(tmp_path_factory):
    """BFCL v4's layout: data/BFCL_v4_<cat>.json and data/possible_answer/BFCL_v4_<cat>.json."""
    root = tmp_path_factory.mktemp("bfcl")
    (root / "possible_answer").mkdir()
    for category, cases in CASES.items():
        name = f"BFCL_v4_{category}.json"
        (root / name).write_text("".join(json.dumps(q) + "\n" for q, _ in cases))
        if cases[0][1] is not None:
            (root / "possible_answer" / name).write_text("".join(
                json.dumps({"id": q["id"], "ground_truth": gt}) + "\n" for q, gt in cases))
    return root


def wrong_calls(row):
    """A call list that must fail: a changed argument, a call where none is expected, or none
    where one is."""
    mode = check_mode(row["category"])
    if mode == "relevance":
        return []
    if mode == "irrelevance":
        tool = row["tools"][0]["function"]
        return [ToolCall(tool["name"], {p: "x" for p in tool["parameters"]["required"]})]
    calls = copy.deepcopy(ground_truth_calls(row["ground_truth"], row["tools"]))
    param, value = next(iter(calls[0].arguments.items()))
    bad = {bool: lambda v: not v, int: lambda v: v + 1000, float: lambda v: v + 1000.5,
           str: lambda v: v + " elsewhere", list: lambda v: [*v, 99],
           dict: lambda v: {**v, "zz_extra": 1}}
    calls[0].arguments[param] = bad[type(value)](value)
    return calls


def test_every_category_loads_with_its_category_and_ground_truth(bfcl_dir):
    for category, cases in CASES.items():
        rows = load_bfcl(bfcl_dir / f"BFCL_v4_{category}.json")
        assert [r["id"] for r in rows] == [q["id"] for q, _ in cases]
        for row, (question, truth) in zip(rows, cases, strict=True):
            assert row["category"] == category, row["id"]
            assert row["ground_truth"] == (truth or []), row["id"]
            assert row["source"] == "bfcl" and row["env"] == "toolrl/FunctionCalling-v0"
            assert row["messages"] == question["question"][0]
            assert [t["function"]["name"] for t in row["tools"]] == \
                [f["name"] for f in question["function"]]
            assert all(t["function"]["description"].endswith(LANGUAGE_HINT) for t in row["tools"])
            assert row["tools"][0]["function"]["parameters"]["type"] == "dict"  # kept for the
            # checker, which reads BFCL's type names exactly


def test_ground_truth_scores_one_and_a_wrong_call_zero_for_every_row(bfcl_dir, tmp_path):
    out = tmp_path / "bfcl.jsonl"
    files = [str(bfcl_dir / f"BFCL_v4_{c}.json") for c in CASES]
    assert main(["data", "convert", "--from", "bfcl", *files, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * len(CASES)
    env = make_env("toolrl/FunctionCalling-v0")
    trajs, expected = [], []
    try:
        for row in rows:
            for policy, success in ((None, True),
                                    (lambda e, m, row=row: HERMES.render(wrong_calls(row),
                                                                        text="Sure."), False)):
                kwargs = {} if policy is None else {"policy": policy}
                ep = asyncio.run(asyncio.wait_for(run_episode(env, row=row, **kwargs), 60))
                assert ep.success is success, (row["id"], success, ep.final_state)
                trajs.append(ep)
                expected.append(1.0 if success else 0.0)
    finally:
        env.close()
    with build_reward(["bfcl_ast"]) as reward:
        assert reward.score(trajs).components["bfcl_ast"] == expected


@pytest.mark.parametrize("row_id,arguments,success", [
    # listed null: null passes and is compared as is; a string is not "" and fails
    ("live_multiple_1-1-0", {"category": "Laptops", "brand": None, "price_max": None}, True),
    ("live_multiple_1-1-0", {"category": "laptops", "brand": "acme"}, False),
    ("live_multiple_1-1-0", {"category": "laptops", "price_max": 900.0}, False),
    # a variable answer (a boolean for a string parameter): the boolean passes, the string not
    ("live_simple_1-1-0", {"repos": "shishirpatil/GORILLA", "aligned": True}, True),
    ("live_simple_1-1-0", {"repos": "ShishirPatil/gorilla", "aligned": "true"}, False),
    ("live_simple_1-1-0", {"repos": "ShishirPatil/gorilla", "aligned": "True"}, False),
])
def test_variable_and_listed_null_rules_end_to_end(bfcl_dir, row_id, arguments, success):
    rows = {r["id"]: r for c in ("live_simple", "live_multiple")
            for r in load_bfcl(bfcl_dir / f"BFCL_v4_{c}.json")}
    row = rows[row_id]
    name = next(iter(row["ground_truth"][0]))
    env = make_env("toolrl/FunctionCalling-v0")
    try:
        env.reset(options=row)
        info = env.step(HERMES.render([ToolCall(name, arguments)]))[4]
    finally:
        env.close()
    assert info["success"] is success, env.unwrapped.check


def test_simple_python_rows_are_not_irrelevance(bfcl_dir):
    """The filed bug: the category was inferred before the answers were joined."""
    rows = load_tasks(bfcl_dir / "BFCL_v4_simple_python.json")
    assert {r["category"] for r in rows} == {"simple_python"}
    env = make_env("toolrl/FunctionCalling-v0")
    try:
        for row in rows:
            env.reset(options=row)
            assert env.step("I will not call anything.")[4]["success"] is False
    finally:
        env.close()
    explicit = load_tasks(bfcl_dir / "BFCL_v4_simple_python.json",
                          answers=bfcl_dir / "possible_answer")  # a folder works too
    assert explicit == rows


def test_clear_errors_for_unscorable_or_unanswered_files(bfcl_dir, tmp_path, capsys):
    memory = tmp_path / "BFCL_v4_memory_kv.json"
    memory.write_text(json.dumps(entry("memory_kv_0", "q", [fn("A.b", {"x": S}, ["x"])])))
    with pytest.raises(ValueError, match="cannot score BFCL category 'memory_kv'"):
        load_bfcl(memory)
    assert main(["data", "convert", "--from", "bfcl", str(memory), "--out",
                 str(tmp_path / "o.jsonl")]) == 2
    assert "memory_kv" in capsys.readouterr().err
    lonely = tmp_path / "BFCL_v4_multiple.json"
    lonely.write_text((bfcl_dir / "BFCL_v4_multiple.json").read_text())
    with pytest.raises(ValueError, match="possible answers are not at"):
        load_bfcl(lonely)
    partial = tmp_path / "answers.json"
    partial.write_text(json.dumps({"id": "multiple_0", "ground_truth": CASES["multiple"][0][1]}))
    with pytest.raises(ValueError, match=r"no possible answer for 1 entries .*multiple_1"):
        load_bfcl(lonely, partial)
    multi = tmp_path / "BFCL_v4_multi_turn_base.json"
    multi.write_text(json.dumps({"id": "multi_turn_base_0", "question": [[], []],
                                 "function": []}))
    with pytest.raises(ValueError, match="multi-turn"):
        load_bfcl(multi)
