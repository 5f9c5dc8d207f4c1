"""l6_snapshot_state: 0 of 9. Keeps the weights, the schedule and the random states but not
the optimizer: SGD's momentum starts again from zero after the restart, so the run drifts
from the one that never stopped."""


def capture_state(model, optimizer, scheduler, generator, progress):
    return {"model": model.state_dict(), "scheduler": scheduler.state_dict(),
            "generator": generator.get_state(), "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(), "numpy_rng": np.random.get_state(),
            "progress": dict(progress)}


def restore_state(state, model, optimizer, scheduler, generator):
    model.load_state_dict(state["model"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"].cpu())
    torch.set_rng_state(state["torch_rng"].cpu())
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    return dict(state["progress"])
