"""l1_rank_layout: 0 of 6. The course's own answer (ddpcourse.topology.layout, behind the
lesson's diagrams) under the exercise's name instead of worked out: the grader refuses it."""

from ddpcourse.topology import layout as rank_layout  # noqa: F401
