from stator.protocols import EngineRequest, StopConditions
from tests.fakes import ScriptedEngine


async def test_scripted_engine_echo_and_limits():
    engine = ScriptedEngine(script=[5, 6, 7, 8])
    req = EngineRequest(request_id="a", model="m", token_ids=[1], stop=StopConditions(max_tokens=2))
    outs = [o async for o in engine.generate(req)]
    assert [t for o in outs for t in o.token_ids] == [5, 6]
    assert outs[-1].finish_reason == "length"
    req = EngineRequest(request_id="b", model="m", token_ids=[9, 8])
    outs = [o async for o in ScriptedEngine().generate(req)]
    assert [t for o in outs for t in o.token_ids] == [9, 8]
    assert outs[-1].finish_reason == "stop"
    req = EngineRequest(
        request_id="c", model="m", token_ids=[1], stop=StopConditions(stop_token_ids_hidden=[7])
    )
    outs = [o async for o in engine.generate(req)]
    assert [t for o in outs for t in o.token_ids] == [5, 6]
    assert outs[-1].stop_token_id == 7
