"""Datasets: real data that can be had offline, shaped for a model's input.

Image datasets give float tensors (N, C, H, W) scaled to [-1, 1], adapted to the model's
input shape (grey 28x28 padded to 32x32 and repeated to 3 channels; much smaller or larger
images are resized), with integer class labels.

Text datasets are for next-character prediction. Text is encoded with the fixed vocabulary
`VOCAB`: newline and the 95 printable ASCII characters (space, letters, digits, punctuation),
96 tokens. Line ends become "\\n", tabs a space, curly quotes and dashes their ASCII forms,
accented letters lose their accents (NFKD), and any other character is dropped. The encoded
text is cut into non-overlapping windows of L = model.input_shape[0] tokens: window k is
x = ids[kL : kL+L], y = ids[kL+1 : kL+L+1]; `num_classes` is the vocabulary size.

Splits are seeded: a seeded `fraction` of the samples (images or windows), then 80/20
(images) or 90/10 (text) train/test.

Modules: `registry` (names and tasks, no data read), `sources` (where files are, how to get
them), `images` and `text` (the loaders), `loading` (`load_dataset`: shaped, subset, split;
imports PyTorch).
"""

from .registry import DATASET_TASKS, USER_DATA, dataset_names, dataset_task
from .sources import SOURCES, DatasetMissingError, locate

__all__ = ["DATASET_TASKS", "SOURCES", "USER_DATA", "DatasetMissingError", "dataset_names", "dataset_task", "locate"]
