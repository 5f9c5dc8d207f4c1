"""class 9, lesson 4's ring: a ready-made collective by every other road. Honest score: 33.

ring_all_reduce first tries the ready-made all-reduce by every route it knows (the plain
call, the c10d operator, torch's functional collectives, a backend's own method, another
thread, a gloo group of its own), catching each refusal, then does the honest ring. The
sums are right and the ring's messages are there, but a collective was asked for in a check
that forbids them: the ring's job-graded points are lost however it was reached.
"""

import threading as _threading
from datetime import timedelta as _timedelta

_honest_ring = ring_all_reduce  # noqa: F821  the reference's, above this part
_tried = {"gloo": False}


def _routes(x):
    import torch.distributed._functional_collectives as funcol

    world = dist.group.WORLD
    yield lambda: dist.all_reduce(x.clone())
    yield lambda: torch.ops.c10d.allreduce_([x.clone()], world.boxed(),
                                            torch.classes.c10d.ReduceOp(), None, False)
    yield lambda: funcol.wait_tensor(funcol.all_reduce(x.clone(), "sum", world))
    yield lambda: world._get_backend(torch.device("cpu")).allreduce([x.clone()]).wait()

    def in_a_thread():
        t = _threading.Thread(target=lambda: dist.all_reduce(x.clone()))
        t.start()
        t.join(5)
    yield in_a_thread
    if not _tried["gloo"]:
        _tried["gloo"] = True

        def own_gloo_group():
            group = dist.new_group(backend="gloo", timeout=_timedelta(seconds=3))
            dist.all_reduce(x.clone(), group=group)
        yield own_gloo_group


def ring_all_reduce(tensor):
    if dist.get_world_size() > 1:
        for route in _routes(tensor):
            try:
                route()
            except Exception:
                pass
    return _honest_ring(tensor)
