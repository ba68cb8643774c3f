// placeholder: filled in by its slice
