"""How the ranks of python_interrupt_test.py's jobs report to it: one small file per rank and
key in the test's directory, OUT_DIR/rank<R>.<key>, there whole or not at all."""
import os


def record_path(out_dir, rank, key):
    return os.path.join(out_dir, "rank%d.%s" % (rank, key))


def record(out_dir, rank, key, text):
    path = record_path(out_dir, rank, key)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)  # the test never reads half a file
