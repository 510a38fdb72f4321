from torch.utils.data import Dataset

def make_dataset(:
    return None
