def make_dataset():
    return (i for i in range(3))
