"""HiDe: the hidden-detail VQA module, its zoom step and the toy multimodal backbone.

Import from the module files (``lightning_modules.hide.<file>``); this package imports nothing eagerly."""
