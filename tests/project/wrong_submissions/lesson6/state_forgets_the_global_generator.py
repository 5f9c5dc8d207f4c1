"""l6_snapshot_state: 0 of 9. Keeps its own generator but not torch's global one, which
dropout draws from: after the restart dropout masks other units than the uninterrupted run
did."""


def capture_state(model, optimizer, scheduler, generator, progress):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "generator": generator.get_state(),
            "python_rng": random.getstate(), "numpy_rng": np.random.get_state(),
            "progress": dict(progress)}


def restore_state(state, model, optimizer, scheduler, generator):
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"].cpu())
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    return dict(state["progress"])
