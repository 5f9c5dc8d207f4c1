"""Small helpers for the course: rank arithmetic and diagrams, launching, devices, tables.

Nothing here hides torch.distributed: the lesson scripts call it themselves. Modules are
imported one by one (``from ddpcourse.topology import layout``) so that ``ddpcourse.cluster.launch``
stays free of torch and starts instantly.
"""
