"""l6_snapshot_state: 0 of 9. Keeps torch's generators and NumPy's but not Python's `random`:
the augmentation choices it makes (which samples are flipped) start again from the seed
after the restart."""


def capture_state(model, optimizer, scheduler, generator, progress):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "generator": generator.get_state(),
            "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
            "progress": dict(progress)}


def restore_state(state, model, optimizer, scheduler, generator):
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"].cpu())
    torch.set_rng_state(state["torch_rng"].cpu())
    np.random.set_state(state["numpy_rng"])
    return dict(state["progress"])
