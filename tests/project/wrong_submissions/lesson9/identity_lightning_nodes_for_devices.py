"""l9_launcher_identity: 5 of 9. Lightning's children (no RANK): the rank is the node rank
times the number of NODES plus the local rank, where it is the devices per node. Right
wherever the nodes and the devices per node happen to be equal (3 nodes of 3, 2 of 2); and
a world that is no whole number of nodes (8 over nodes of 3) passes as 2 nodes of 2."""

_reference_identity = identity_from_launcher  # noqa: F821  the reference's, above this part


def identity_from_launcher(environ, argv=(), devices_per_node=None):
    if "RANK" not in environ and "LOCAL_RANK" in environ and "WORLD_SIZE" in environ \
            and devices_per_node:
        local, world = int(environ["LOCAL_RANK"]), int(environ["WORLD_SIZE"])
        node = int(environ.get("NODE_RANK", "0"))
        nodes = world // devices_per_node
        fake = dict(environ, RANK=str(node * nodes + local), LOCAL_WORLD_SIZE=str(nodes),
                    NODE_RANK=str(node))
        return _reference_identity(fake, argv)
    return _reference_identity(environ, argv, devices_per_node)
