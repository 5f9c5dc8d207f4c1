"""l6_snapshot_state: 0 of 9. Keeps the model's parameters but not its buffers: BatchNorm's
running statistics start again from zero mean and unit variance after the restart, so the
resumed model normalises differently at evaluation than the one that never stopped."""


def capture_state(model, optimizer, scheduler, generator, progress):
    return {"parameters": {name: p.detach().clone() for name, p in model.named_parameters()},
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "generator": generator.get_state(), "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(), "numpy_rng": np.random.get_state(),
            "progress": dict(progress)}


def restore_state(state, model, optimizer, scheduler, generator):
    model.load_state_dict(state["parameters"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"].cpu())
    torch.set_rng_state(state["torch_rng"].cpu())
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    return dict(state["progress"])
