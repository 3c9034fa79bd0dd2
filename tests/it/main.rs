mod prd;
