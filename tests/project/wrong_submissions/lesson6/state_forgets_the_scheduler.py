"""l6_snapshot_state: 0 of 9. Keeps everything but the learning-rate schedule: the restored
scheduler believes it is at step 0, so the cosine takes another course from the restart on."""


def capture_state(model, optimizer, scheduler, generator, progress):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "generator": generator.get_state(), "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(), "numpy_rng": np.random.get_state(),
            "progress": dict(progress)}


def restore_state(state, model, optimizer, scheduler, generator):
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"].cpu())
    torch.set_rng_state(state["torch_rng"].cpu())
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    return dict(state["progress"])
