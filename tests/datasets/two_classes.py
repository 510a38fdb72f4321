from torch.utils.data import Dataset


class A(Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, i):
        return i


class B(A):
    pass
