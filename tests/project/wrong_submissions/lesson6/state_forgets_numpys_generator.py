"""l6_snapshot_state: 0 of 9. Keeps torch's generators and Python's but not NumPy's global
one: the augmentation's random scales start again from the seed after the restart."""


def capture_state(model, optimizer, scheduler, generator, progress):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "generator": generator.get_state(),
            "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
            "progress": dict(progress)}


def restore_state(state, model, optimizer, scheduler, generator):
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"].cpu())
    torch.set_rng_state(state["torch_rng"].cpu())
    random.setstate(state["python_rng"])
    return dict(state["progress"])
