import pytest

from ddpcourse.report import format_table, parse_summary, parse_table, summary_line
from ddpcourse.topology import Process, draw, layout, rank_table


def test_layout_matches_the_reading_one_gpu_per_process():
    job = layout(2, 4, 1)
    assert len(job) == 8
    assert job[5] == Process(5, 1, 1, (1,))
    assert [p.global_rank for p in job] == list(range(8))
    assert [p.local_rank for p in job] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_layout_matches_the_reading_two_gpus_per_process():
    job = layout(2, 4, 2)
    assert [(p.global_rank, p.node, p.local_rank, p.gpus) for p in job] == [
        (0, 0, 0, (0, 1)), (1, 0, 1, (2, 3)), (2, 1, 0, (0, 1)), (3, 1, 1, (2, 3))]


@pytest.mark.parametrize("shape", [(2, 4, 3), (0, 1, 1), (1, 0, 1), (1, 2, 0)])
def test_layout_rejects_bad_shapes(shape):
    with pytest.raises(ValueError):
        layout(*shape)


def test_rank_table_lists_every_process_in_rank_order():
    lines = rank_table(list(reversed(layout(2, 4, 2)))).splitlines()
    assert lines[0].split() == ["global", "rank", "node", "local", "rank", "GPUs"]
    assert [line.split()[0] for line in lines[2:]] == ["0", "1", "2", "3"]
    assert lines[3].split() == ["1", "0", "1", "2,3"]


def test_draw_makes_one_box_per_node_and_one_span_per_process():
    import matplotlib

    matplotlib.use("Agg")
    fig = draw(layout(3, 2, 1), gpus_per_node=2)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert [t for t in texts if t.startswith("node")] == ["node 0", "node 1", "node 2"]
    assert sum(t.startswith("R") for t in texts) == 6
    assert "R5  L1" in texts
    cpu = draw([Process(0, 0, 0), Process(1, 0, 1)])
    assert [t.get_text() for t in cpu.axes[0].texts].count("CPU") == 2
    with pytest.raises(ValueError):
        draw([])


def test_format_table_and_summary_line():
    table = format_table([{"a": 1, "bb": "x"}, {"a": 100, "bb": "yy"}])
    assert table.splitlines() == ["a    bb", "---  --", "1    x", "100  yy"]
    assert summary_line(world_size=4, loss=0.123456) == "summary: world_size=4 loss=0.1235"


def test_parse_table_reads_back_the_first_table_format_table_wrote():
    rows = [{"library": "Fabric", "started by": "python", "W": 2},
            {"library": "Accelerate, its own loader", "started by": "torchrun", "W": 3}]
    out = (f"rank 0: training\n\nfinal weights:\n{format_table(rows)}\nsummary: runs=2\n"
           f"{format_table([{'other': 1}])}\n")
    assert parse_table(out) == [{key: str(value) for key, value in row.items()} for row in rows]


def test_parse_summary_reads_back_what_summary_line_wrote():
    fields = {"world_size": 3, "loss": 0.123456, "ok": True, "caps": "default,25", "empty": ""}
    line = summary_line(**fields)
    out = f"rank 0: summary of nothing\nsummary: world_size=1 stale=yes\n{line}\nbye\n"
    assert parse_summary(out) == {"world_size": "3", "loss": "0.1235", "ok": "True",
                                  "caps": "default,25", "empty": ""}
    assert parse_summary(line, once=True) == parse_summary(out)
    with pytest.raises(ValueError, match="2 `summary: ...` lines where one was expected"):
        parse_summary(out, once=True)  # a summary printed twice: by every rank, say
    with pytest.raises(ValueError, match="0 `summary: ...` lines(.|\n)*no summary here"):
        parse_summary("training...\nno summary here\n")
