mod process;
