"""A real PyTorch worker using torch's @record: rank 0 raises ValueError('bad batch 7')."""
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "0":
        raise ValueError("bad batch 7")
    time.sleep(30)


if __name__ == "__main__":
    main()
