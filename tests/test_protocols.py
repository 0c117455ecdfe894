import msgspec
import pytest

from stator.protocols import (
    AdminRequest,
    AllCleared,
    BlockRemoved,
    BlockStored,
    DisaggParams,
    EngineOutput,
    EngineRequest,
    GuidedDecoding,
    KvEvent,
    KvEventBatch,
    LoadReport,
    LoraInfo,
    ModelCard,
    RoutingHints,
    SamplingOptions,
    StopConditions,
    TokenLogprob,
    TopLogprob,
    Usage,
    decode,
    encode,
)

SAMPLES = [
    EngineRequest(
        request_id="r",
        model="m",
        token_ids=[1, 2, 3],
        sampling=SamplingOptions(
            temperature=0.5,
            top_k=3,
            logit_bias={5: -1.5},
            logprobs=2,
            guided_decoding=GuidedDecoding(json_schema={"type": "object"}),
        ),
        stop=StopConditions(max_tokens=7, stop_token_ids_hidden=[2], ignore_eos=True),
        lora_name="a",
        routing=RoutingHints(target_worker_id=5, overlap_weight=0.5),
        disagg=DisaggParams(prefill_worker_id=9, remote_block_ids=[1, 2]),
        annotations={"k": "v"},
    ),
    EngineOutput(
        token_ids=[4],
        logprobs=[TokenLogprob(token_id=4, logprob=-0.1, top=[TopLogprob(4, -0.1)])],
        finish_reason="length",
        cached_tokens=16,
        usage=Usage(prompt_tokens=3, completion_tokens=1, cached_tokens=0),
    ),
    ModelCard(
        name="tiny",
        source_path="/m",
        files={"tokenizer.json": b"{}"},
        loras=[LoraInfo(name="l", path="/l")],
        role="prefill",
    ),
    KvEventBatch(
        events=[
            KvEvent(
                worker_id=1, event_id=0, data=BlockStored(block_hashes=[1, 2], token_ids=[1] * 32)
            ),
            KvEvent(worker_id=1, event_id=1, data=BlockRemoved(block_hashes=[2])),
            KvEvent(worker_id=1, event_id=2, data=AllCleared(), dp_rank=1),
        ]
    ),
    LoadReport(worker_id=3, active_kv_blocks=10, total_kv_blocks=100, num_waiting=2),
    AdminRequest(op="load_lora", args={"name": "x"}),
]


@pytest.mark.parametrize("obj", SAMPLES, ids=lambda o: type(o).__name__)
def test_round_trip(obj):
    assert decode(encode(obj), type(obj)) == obj


def test_kv_event_union_is_tagged():
    data = encode(KvEvent(worker_id=1, event_id=0, data=AllCleared()))
    assert isinstance(decode(data, KvEvent).data, AllCleared)


def test_defaults_are_omitted_on_the_wire():
    small = encode(EngineOutput(token_ids=[1]))
    assert len(small) < 16


def test_wrong_types_are_rejected():
    bad = encode({"request_id": 1, "model": "m"})
    with pytest.raises(msgspec.ValidationError):
        decode(bad, EngineRequest)
