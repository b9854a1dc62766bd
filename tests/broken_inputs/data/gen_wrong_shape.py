def rows(count, seed):
    return {"prompt": "1+1=", "answer": "2"}
