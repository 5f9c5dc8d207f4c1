"""`python -m ddpcourse.figures` (make figures): write every lesson figure."""

import argparse
from pathlib import Path

from ddpcourse.figures import write_figures


def main() -> None:
    parser = argparse.ArgumentParser(description="Write every lesson figure.")
    parser.add_argument("--lesson", type=int, action="append")
    parser.add_argument("--out", type=Path, default=None, help="a folder instead of lessons/")
    args = parser.parse_args()
    for path in write_figures(args.lesson, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
