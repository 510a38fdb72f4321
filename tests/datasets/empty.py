from torch.utils.data import Dataset


class Empty(Dataset):
    def __len__(self):
        return 0

    def __getitem__(self, i):
        raise IndexError(i)


dataset = Empty()
