def make_dataset():
    return [1, 2, 3]
