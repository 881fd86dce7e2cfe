#!/usr/bin/python3
"""Writes bench/resnet50_gradients.txt: the gradient list of torchvision's resnet50.

    /usr/bin/python3 bench/resnet50_gradients.py > bench/resnet50_gradients.txt

One line per parameter (161 of them), in model.named_parameters() order: its name and shape.
The step benchmarks (krug-bench step --shapes, krug_small_ops.py, torch_gloo_bench.py) read it
so that the C++ benchmark needs no torchvision; they submit the tensors in reverse order, the
order in which backward() produces the gradients.
"""
from torchvision import models


def main():
    params = list(models.resnet50().named_parameters())
    total = sum(p.numel() for _, p in params)
    print("# torchvision resnet50 gradients: %d tensors, %d float32 elements (%d bytes)"
          % (len(params), total, 4 * total))
    print("# written by: /usr/bin/python3 bench/resnet50_gradients.py")
    print("# name shape (dimensions separated by 'x')")
    for name, p in params:
        print("%s %s" % (name, "x".join(str(d) for d in p.shape)))


if __name__ == "__main__":
    main()
