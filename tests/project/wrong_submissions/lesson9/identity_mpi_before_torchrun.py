"""l9_launcher_identity: 7 of 9. Open MPI's variables are read before torchrun's: right for
mpirun alone and inside an allocation, wrong for torchrun started by mpirun (one per node),
whose workers inherit mpirun's variables beside their own: the innermost launcher is
torchrun."""

_reference_identity = identity_from_launcher  # noqa: F821  the reference's, above this part


def identity_from_launcher(environ, argv=(), devices_per_node=None):
    if "OMPI_COMM_WORLD_RANK" in environ:
        mpi_only = {k: v for k, v in environ.items()
                    if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK")}
        return _reference_identity(mpi_only, argv, devices_per_node)
    return _reference_identity(environ, argv, devices_per_node)
