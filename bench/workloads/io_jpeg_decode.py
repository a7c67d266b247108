"""io: JPEG decoding and heavy augmentation in the main process starve a small GPU model.

Baseline: a Dataset decodes each JPEG and augments it on the CPU (random resized crop with
antialiasing, flip, colour jitter, Gaussian blur) with num_workers=0, so the training step of a
ResNet-18 waits on the CPU every batch.
Fixed (--fixed): num_workers=8, pin_memory=True, persistent_workers=True and non_blocking
copies, so eight processes prepare batches while the GPU trains.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, Dataset
from torchvision.io import decode_jpeg, encode_jpeg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import resolve_device, train_classifier, workload_parser  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    photo_width: int
    photo_height: int
    crop: int               # model input side
    batch: int
    distinct_photos: int
    blur_kernel: int        # odd


FULL = Sizes(photo_width=960, photo_height=720, crop=224, batch=32, distinct_photos=32, blur_kernel=9)
SMALL = Sizes(photo_width=96, photo_height=72, crop=32, batch=4, distinct_photos=8, blur_kernel=3)
NUM_CLASSES = 100


def synthetic_photo(width: int, height: int, rng: torch.Generator) -> torch.Tensor:
    """uint8 (3, H, W) with photo-like content: smooth shapes plus fine texture, so the JPEG
    carries about as much entropy (and costs as much to decode) as a real photo."""
    coarse = torch.rand(1, 3, max(2, height // 32), max(2, width // 32), generator=rng)
    smooth = F.interpolate(coarse, size=(height, width), mode="bicubic", align_corners=False)[0]
    texture = 0.08 * torch.randn(3, height, width, generator=rng)
    return ((smooth + texture).clamp(0, 1) * 255).to(torch.uint8)


class AugmentedPhotos(Dataset):
    def __init__(self, jpegs: list[torch.Tensor], length: int, sizes: Sizes):
        self.jpegs = jpegs
        self.length = length
        self.sizes = sizes
        blur = torch.signal.windows.gaussian(sizes.blur_kernel, std=sizes.blur_kernel / 4)
        self.blur = (blur / blur.sum()).view(1, 1, 1, -1).repeat(3, 1, 1, 1)  # depthwise, 1-D
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        image = decode_jpeg(self.jpegs[index % len(self.jpegs)]).float().div_(255)
        image = self.random_resized_crop(image)
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        image = self.colour_jitter(image)
        image = self.gaussian_blur(image)
        image = (image - self.mean) / self.std
        return image, index % NUM_CLASSES

    def random_resized_crop(self, image: torch.Tensor) -> torch.Tensor:
        _, height, width = image.shape
        scale = float(torch.empty(()).uniform_(0.3, 1.0))
        crop_h, crop_w = max(8, int(height * scale)), max(8, int(width * scale))
        top = int(torch.randint(0, height - crop_h + 1, ()))
        left = int(torch.randint(0, width - crop_w + 1, ()))
        patch = image[:, top:top + crop_h, left:left + crop_w].unsqueeze(0)
        side = self.sizes.crop
        return F.interpolate(patch, size=(side, side), mode="bilinear", antialias=True,
                             align_corners=False)[0]

    @staticmethod
    def colour_jitter(image: torch.Tensor) -> torch.Tensor:
        brightness, contrast, saturation = torch.empty(3).uniform_(0.7, 1.3).tolist()
        image = image * brightness
        image = (image - image.mean()) * contrast + image.mean()
        grey = image.mul(torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)).sum(0, keepdim=True)
        return ((image - grey) * saturation + grey).clamp_(0, 1)

    def gaussian_blur(self, image: torch.Tensor) -> torch.Tensor:
        pad = self.sizes.blur_kernel // 2
        x = F.pad(image.unsqueeze(0), (pad, pad, pad, pad), mode="reflect")
        x = F.conv2d(x, self.blur, groups=3)                                  # horizontal
        x = F.conv2d(x, self.blur.transpose(-1, -2), groups=3)                # vertical
        return x[0]


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = resolve_device(args.device)
    sizes = SMALL if args.small else FULL
    torch.manual_seed(args.seed)

    rng = torch.Generator().manual_seed(args.seed)
    jpegs = [encode_jpeg(synthetic_photo(sizes.photo_width, sizes.photo_height, rng), quality=95)
             for _ in range(sizes.distinct_photos)]
    dataset = AugmentedPhotos(jpegs, length=args.steps * sizes.batch, sizes=sizes)
    pin_memory = args.fixed and device.type == "cuda"   # pinning only helps copies to a GPU
    if args.fixed:
        workers = min(8, os.cpu_count() or 1) if args.small else 8   # small CI machines
        loader = DataLoader(dataset, batch_size=sizes.batch, shuffle=True, drop_last=True,
                            num_workers=workers, pin_memory=pin_memory, persistent_workers=True)
    else:
        loader = DataLoader(dataset, batch_size=sizes.batch, shuffle=True, drop_last=True)

    model = torchvision.models.resnet18(weights=None, num_classes=NUM_CLASSES).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    train_classifier(loader, model, optimizer, device, pin_memory, "io_jpeg_decode", args.fixed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
