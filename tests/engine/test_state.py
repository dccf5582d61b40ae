import torch

from fl_lightning.engine.state import ClientStateStore


def test_store_keeps_detached_cpu_copies_and_round_trips():
    store = ClientStateStore()
    t = torch.ones(3, requires_grad=True)
    store.put(4, {"c": t * 2})
    got = store.get(4)
    assert got["c"].device.type == "cpu" and not got["c"].requires_grad
    assert torch.equal(got["c"], torch.full((3,), 2.0))
    got["c"].add_(1)  # get returns a copy: a client that fails mid-round leaves its stored state intact
    assert torch.equal(store.get(4)["c"], torch.full((3,), 2.0))
    assert 4 in store and len(store) == 1 and store.nbytes() == 12
    assert store.get(7) == {}
    other = ClientStateStore()
    other.load_state_dict(store.state_dict())
    assert torch.equal(other.get(4)["c"], store.get(4)["c"])
    store.put(4, {})
    assert 4 not in store


def test_states_beyond_the_memory_budget_spill_to_disk_and_come_back(tmp_path):
    store = ClientStateStore(memory_budget=3 * 400, directory=tmp_path)
    for cid in range(10):
        store.put(cid, {"dual": torch.full((100,), float(cid))})  # 400 bytes each
    assert store.nbytes() <= 1200 and store.spilled() == 7 and len(store) == 10
    assert len(list(tmp_path.glob("client_*.safetensors"))) == 7
    for cid in range(10):  # least recently used went to disk; everything reads back exactly
        assert torch.equal(store.get(cid)["dual"], torch.full((100,), float(cid)))
    full = store.state_dict()
    assert sorted(full) == list(range(10))
    store.put(0, {"dual": torch.zeros(100)})  # rewriting a spilled client replaces its file
    assert torch.equal(store.get(0)["dual"], torch.zeros(100)) and len(store) == 10
    restored = ClientStateStore(memory_budget=800, directory=tmp_path / "b")
    restored.load_state_dict(full)
    assert torch.equal(restored.get(9)["dual"], full[9]["dual"]) and restored.spilled() == 8
