"""l6_snapshot_state: 9 of 9. Right, written another way: one deep copy of everything that
has a state_dict, the generators through torch.random and NumPy's dictionary form, and
the progress kept by key."""

import copy


def capture_state(model, optimizer, scheduler, generator, progress):
    with_state_dicts = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    state = {key: copy.deepcopy(part.state_dict()) for key, part in with_state_dicts.items()}
    state["generators"] = {"rank": generator.get_state(),
                           "torch": torch.random.get_rng_state(),
                           "python": random.getstate(),
                           "numpy": np.random.get_state(legacy=False)}
    state.update({f"progress/{key}": value for key, value in progress.items()})
    return state


def restore_state(state, model, optimizer, scheduler, generator):
    for key, part in {"model": model, "optimizer": optimizer, "scheduler": scheduler}.items():
        part.load_state_dict(state[key])
    generators = state["generators"]
    generator.set_state(generators["rank"].to("cpu"))
    torch.random.set_rng_state(generators["torch"].to("cpu"))
    random.setstate(generators["python"])
    np.random.set_state(generators["numpy"])
    return {key.split("/", 1)[1]: value for key, value in state.items()
            if key.startswith("progress/")}
