"""The UR5e image encoder (three 224x224 cameras through ResNet-18): channels-last against NCHW.

    python benchmarks/image_encoder.py [--threads 2] [--repeats 20] [--device cpu]

`ImageEncoder` keeps its convolution weights and input channels-last (NHWC). This times one
observation's encoding as built and with the same weights in NCHW, the two alternating so both
see the same machine load, and prints the medians and the largest output difference.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from simdist_planner.model.config import ImageEncoderConfig
from simdist_planner.model.encoders import ImageEncoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = ImageEncoderConfig(
        cameras=("wrist", "overhead", "side"), height=224, width=224, backbone="resnet18"
    )
    nhwc = ImageEncoder(cfg).eval().to(args.device)
    nchw = copy.deepcopy(nhwc)
    nchw.backbone.to(memory_format=torch.contiguous_format)
    images = torch.randint(0, 256, (1, 3, 3, 224, 224), dtype=torch.uint8, device=args.device)

    def encode_nchw():
        return nchw.backbone(nchw.preprocess(images).contiguous())

    def encode_nhwc():
        return nhwc(images)

    times: dict[str, list[float]] = {"channels-last": [], "NCHW": []}
    with torch.inference_mode():
        diff = (encode_nhwc() - encode_nchw().reshape(1, -1)).abs().max().item()
        for _ in range(3):
            encode_nhwc(), encode_nchw()
        for _ in range(args.repeats):
            for name, fn in (("channels-last", encode_nhwc), ("NCHW", encode_nchw)):
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - start)
    print(f"device {args.device}, {args.threads} threads, {args.repeats} repeats each")
    for name, values in times.items():
        values.sort()
        print(f"  {name:14s} median {values[len(values) // 2] * 1e3:7.1f} ms")
    print(f"  largest output difference {diff:.2e}")


if __name__ == "__main__":
    main()
