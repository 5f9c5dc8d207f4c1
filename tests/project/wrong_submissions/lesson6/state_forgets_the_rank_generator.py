"""l6_snapshot_state: 0 of 9. Keeps torch's global generator but not the rank's own one, the
data augmentation's: the restarted ranks draw their noise from the beginning again."""


def capture_state(model, optimizer, scheduler, generator, progress):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(), "numpy_rng": np.random.get_state(),
            "progress": dict(progress)}


def restore_state(state, model, optimizer, scheduler, generator):
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"].cpu())
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    return dict(state["progress"])
