"""Reading Mooncake (.jsonl) and Azure (.csv) request traces: values, order, errors naming the line, real files."""

import json
from pathlib import Path

import pytest

from traces.errors import TraceFormatError
from traces.request_trace import Request, load_request_trace

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "requests"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def mooncake_row(timestamp=0, input_length=600, output_length=10, hash_ids=(0, 1)) -> dict:
    return {"timestamp": timestamp, "input_length": input_length, "output_length": output_length,
            "hash_ids": list(hash_ids)}


def real_file(name: str) -> Path:
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (real request traces live outside the repository)")
    return path


def test_mooncake_rows_become_requests_sorted_by_arrival_in_seconds(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [
        mooncake_row(timestamp=3500, input_length=1025, output_length=7, hash_ids=(4, 5, 6)),
        mooncake_row(timestamp=1000, input_length=512, output_length=1, hash_ids=(4,)),
        mooncake_row(timestamp=1000, input_length=20, output_length=3, hash_ids=(9,)),
    ])
    requests = load_request_trace(path, traffic_class="agent")
    assert requests == [
        Request(0.0, 512, 1, (4,), "agent"),
        Request(0.0, 20, 3, (9,), "agent"),
        Request(2.5, 1025, 7, (4, 5, 6), "agent"),
    ]


def test_azure_rows_keep_fractional_seconds_from_the_first_request(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(f"{AZURE_HEADER}\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951691,396,109\n"
                    f"2023-11-16 18:16:00,5,2\n")
    requests = load_request_trace(path)
    assert [(r.input_tokens, r.output_tokens, r.block_hashes) for r in requests] == [(374, 44, ()), (396, 109, ()),
                                                                                      (5, 2, ())]
    assert requests[0].arrival_s == 0.0
    assert requests[1].arrival_s == pytest.approx(4.3145791, abs=1e-9)
    assert requests[2].arrival_s == pytest.approx(13.31941, abs=1e-9)


def test_a_request_with_no_output_token_or_an_absurd_length_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(f"{AZURE_HEADER}\n2023-11-16 18:15:46.1,374,0\n")
    with pytest.raises(TraceFormatError, match="GeneratedTokens=0; expected a whole number of tokens in \\[1, "):
        load_request_trace(path)
    for row in (mooncake_row(output_length=0), mooncake_row(input_length=10**12)):
        with pytest.raises(TraceFormatError, match="expected a whole number of tokens in"):
            load_request_trace(write_jsonl(tmp_path / "t.jsonl", [row]))


def test_num_images_column_is_read_into_images(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n2025-05-01 00:00:01.5,2,900,30\n")
    assert load_request_trace(path)[0].images == 2


def test_limit_keeps_the_earliest_requests(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [mooncake_row(timestamp=t) for t in (50, 10, 30, 20)])
    assert [r.arrival_s for r in load_request_trace(path, limit=2)] == [0.0, 0.01]


@pytest.mark.parametrize(
    "lines, expected",
    [
        (['{"timestamp": 0, "input_length": 5, "output_length": 1}'], "line 1: missing field hash_ids"),
        ([json.dumps(mooncake_row()), json.dumps(mooncake_row(input_length=-3))], "line 2: input_length=-3"),
        ([json.dumps(mooncake_row(output_length=-1))], "line 1: output_length=-1"),
        ([json.dumps(mooncake_row(input_length=0))], "line 1: input_length=0; expected a whole number of tokens in [1, "),
        ([json.dumps(mooncake_row(input_length="12"))], "line 1: input_length='12'; expected a whole number"),
        ([json.dumps(mooncake_row(timestamp="soon"))], "line 1: timestamp='soon'"),
        ([json.dumps(mooncake_row()), "", "{not json"], "line 3: not valid JSON"),
        (["[1, 2]"], "line 1: found a JSON list"),
        ([json.dumps(mooncake_row(hash_ids=("a",)))], "line 1: hash_ids must be a list of integer block ids"),
    ],
    ids=["missing-field", "negative-input", "negative-output", "zero-input", "string-length", "string-timestamp",
         "bad-json", "not-an-object", "non-integer-hash"],
)
def test_bad_mooncake_line_raises_one_line_error_naming_the_line(tmp_path, lines, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError) as info:
        load_request_trace(path)
    message = str(info.value)
    assert expected in message and str(path) in message and "\n" not in message


@pytest.mark.parametrize(
    "body, expected",
    [
        ("TIMESTAMP,Tokens\n", "line 1: header"),
        (f"{AZURE_HEADER}\n2023-11-16 18:15:46.1,374,44\n2023-11-16 18:15:47.1,abc,44\n",
         "line 3: ContextTokens='abc'"),
        (f"{AZURE_HEADER}\n2023-11-16 18:15:46.1,374,-2\n", "line 2: GeneratedTokens=-2"),
        (f"{AZURE_HEADER}\n16/11/2023 18:15,374,44\n", "line 2: TIMESTAMP='16/11/2023 18:15'"),
        (f"{AZURE_HEADER}\n2023-11-16 18:15:46.1,374\n", "line 2: 2 fields; expected 3"),
    ],
    ids=["bad-header", "non-numeric", "negative-output", "bad-timestamp", "short-row"],
)
def test_bad_azure_row_raises_one_line_error_naming_the_line(tmp_path, body, expected):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(TraceFormatError) as info:
        load_request_trace(path)
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("name, body", [("empty.jsonl", ""), ("blank.jsonl", "\n\n"), ("empty.csv", ""),
                                        ("header-only.csv", AZURE_HEADER + "\n")],
                         ids=["empty-jsonl", "blank-jsonl", "empty-csv", "header-only-csv"])
def test_file_without_requests_is_refused(tmp_path, name, body):
    (tmp_path / name).write_text(body)
    with pytest.raises(TraceFormatError, match="holds no requests"):
        load_request_trace(tmp_path / name)


def test_unknown_extension_and_missing_file_are_refused(tmp_path):
    (tmp_path / "t.parquet").write_text("x")
    with pytest.raises(TraceFormatError, match=r"unknown request-trace format '\.parquet'"):
        load_request_trace(tmp_path / "t.parquet")
    with pytest.raises(TraceFormatError, match="request trace not found"):
        load_request_trace(tmp_path / "absent.jsonl")


@pytest.mark.parametrize("kwargs", [dict(traffic_class="batch"), dict(limit=0), dict(limit=1.5)],
                         ids=["unknown-class", "zero-limit", "float-limit"])
def test_bad_options_raise_value_error(tmp_path, kwargs):
    path = write_jsonl(tmp_path / "t.jsonl", [mooncake_row()])
    with pytest.raises(ValueError):
        load_request_trace(path, **kwargs)


def test_request_refuses_impossible_values():
    with pytest.raises(ValueError, match="input_tokens and output_tokens must be >= 1"):
        Request(0.0, 0, 1)
    with pytest.raises(ValueError, match="traffic_class"):
        Request(0.0, 1, 1, traffic_class="batch")
    with pytest.raises(ValueError, match="arrival_s"):
        Request(-1.0, 1, 1)


def test_real_mooncake_conversation_trace_loads_with_monotone_arrivals_and_a_block_per_512_tokens():
    requests = load_request_trace(real_file("mooncake_conversation_trace.jsonl"))
    assert len(requests) == 12_031
    assert requests[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(requests, requests[1:]))
    assert all(len(r.block_hashes) == -(-r.input_tokens // 512) for r in requests)


@pytest.mark.parametrize(
    "name, count, last_s",
    [("mooncake_synthetic_trace.jsonl", 3_993, 1022.025), ("azure_llm_2023_conv.csv", 19_366, 3501.721937),
     ("azure_llm_2023_code.csv", 8_819, 3435.948056)],
    ids=["mooncake-synthetic", "azure-conv", "azure-code"],
)
def test_real_traces_load_every_request_from_time_zero(name, count, last_s):
    requests = load_request_trace(real_file(name))
    assert len(requests) == count
    assert requests[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(requests, requests[1:]))
    assert requests[-1].arrival_s == pytest.approx(last_s, abs=1e-6)


HOSTILE_TRACES = [
    ("csv-field-over-128-kib", "t.csv", f"{AZURE_HEADER}\n2023-11-16 18:15:46.1,{'9' * 200_000},5\n",
     "line 2: not CSV that can be read (field larger than field limit"),
    ("jsonl-5000-digit-integer", "t.jsonl", '{"timestamp": 1, "input_length": ' + "9" * 5000
     + ', "output_length": 1, "hash_ids": []}\n', "line 1: a number too long to read"),
    ("jsonl-100000-nested-arrays", "t.jsonl", "[" * 100_000 + "]" * 100_000 + "\n",
     "line 1: arrays or objects nested too deeply to read"),
    ("jsonl-5000-character-value", "t.jsonl", '{"timestamp": "' + "A" * 5000
     + '", "input_length": 1, "output_length": 1, "hash_ids": []}\n', "timestamp='AAAA"),
    ("csv-4000-digit-count", "t.csv", f"{AZURE_HEADER}\n2023-11-16 18:15:46.1,{'9' * 4000},5\n",
     "ContextTokens='99999"),
]


@pytest.mark.parametrize(("name", "body", "expected"), [h[1:] for h in HOSTILE_TRACES],
                         ids=[h[0] for h in HOSTILE_TRACES])
def test_a_hostile_request_trace_is_refused_in_one_short_line(tmp_path, name, body, expected):
    (tmp_path / name).write_text(body)
    with pytest.raises(TraceFormatError) as info:
        load_request_trace(tmp_path / name)
    message = str(info.value)
    assert expected in message and "\n" not in message and len(message) < 300, message


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl"])
def test_an_error_in_a_linked_trace_repeats_nothing_of_the_file_it_points_to(tmp_path, name):
    secret = tmp_path / "shadow"
    secret.write_text("admin:$6$SECRETHASH:19000:0:99999:7:::\nTIMESTAMP,ContextTokens,GeneratedTokens\n")
    (tmp_path / name).symlink_to(secret)
    with pytest.raises(TraceFormatError) as info:
        load_request_trace(tmp_path / name)
    assert "SECRET" not in str(info.value) and "admin" not in str(info.value), str(info.value)
    (tmp_path / "rows.csv").write_text(f"{AZURE_HEADER}\n2023-11-16 18:15:46.1,SECRET,5\n")
    (tmp_path / "linked.csv").symlink_to(tmp_path / "rows.csv")
    with pytest.raises(TraceFormatError, match="a value not shown: the trace is a symbolic link") as info:
        load_request_trace(tmp_path / "linked.csv")
    assert "SECRET" not in str(info.value)
